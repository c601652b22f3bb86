import CFuse
