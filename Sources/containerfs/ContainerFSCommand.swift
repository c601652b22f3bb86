import ArgumentParser

@main
struct ContainerFSCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "containerfs",
        abstract: "iOS-style app containers and file coordination for Linux, over FUSE.",
        discussion: """
        Start with the demo: `containerfs mount --demo /tmp/containerfs-demo`, then look around with \
        ls and cat, and unmount with `containerfs unmount /tmp/containerfs-demo`.
        """,
        version: "0.1.0",
        subcommands: [
            Install.self,
            List.self,
            Mount.self,
            RunCommand.self,
            VersionsCommand.self,
            RestoreVersionCommand.self,
            Unmount.self,
            VerifyCommand.self,
            CheckCommand.self,
            DeliverCommand.self,
            UninstallCommand.self,
            PurgeCommand.self,
            BackupCommand.self,
            RestoreCommand.self,
            WatchCommand.self,
            CoordinateCommand.self,
            StatusCommand.self,
            ExampleNotesCommand.self,
            ExampleDocumentCommand.self,
        ]
    )
}
