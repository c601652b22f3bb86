@testable import ContainerFS
import Foundation
import XCTest

/// The daemon's descriptors shared between users: the arithmetic on its own, then a second user
/// who looks up more directories than its share beside root.
final class DescriptorSharesTests: XCTestCase {
    func testAUserHoldsAtMostHalfAndUsersLeaveAnEighth() {
        var shares = DescriptorShares(limit: 16)
        XCTAssertEqual(shares.perUser, 8)
        XCTAssertEqual(shares.forUsers, 14)
        for _ in 0..<8 { XCTAssertTrue(shares.take(4242)) }
        XCTAssertFalse(shares.take(4242), "past its half")
        for _ in 0..<6 { XCTAssertTrue(shares.take(4343)) }
        XCTAssertFalse(shares.take(4343), "users together leave an eighth")
        XCTAssertFalse(shares.take(4444))
        XCTAssertTrue(shares.take(0), "root is not counted")
        XCTAssertTrue(shares.take(geteuid()), "nor the daemon's own user")
        shares.give(4242)
        XCTAssertTrue(shares.take(4444), "a descriptor given back is free again")
        XCTAssertEqual(shares.held, [4242: 7, 4343: 6, 4444: 1])
        XCTAssertEqual(shares.heldByUsers, 14)
        shares.give(0)
        XCTAssertEqual(shares.heldByUsers, 14, "what was not counted is not given back")
    }
}

/// With allow_other, a user who looks up more directories than its share of the daemon's
/// descriptors gets EMFILE, and root's lookups and opens go on.
final class DescriptorSharesMountedTests: MountedTestCase {
    static let limit = 512
    static let directories = 400

    override func setUpWithError() throws {
        try XCTSkipIf(geteuid() != 0, "needs root to act as another user")
        mounted = try MountedStore(extraArguments: ["-o", "allow_other"], descriptorLimit: Self.limit) { store in
            let documents = store.containerPath(.init(SampleApps.notes)!) + "/Documents"
            for folder in ["users", "roots"] {
                for index in 0..<Self.directories {
                    try FileManager.default.createDirectory(atPath: "\(documents)/\(folder)/d\(index)",
                                                            withIntermediateDirectories: true)
                }
            }
            try FileManager.default.createDirectory(atPath: documents + "/files", withIntermediateDirectories: true)
            for index in 0..<Self.directories {
                try Data("file \(index)\n".utf8).write(to: URL(fileURLWithPath: "\(documents)/files/f\(index)"))
            }
        }
    }

    func testAUserPastItsShareGetsEMFILEAndRootGoesOn() {
        let user = Shell.run("""
        setpriv --reuid=4242 --regid=4242 --clear-groups /usr/bin/python3 -c '
        import errno, os
        names = os.listdir("Documents/users")
        refused = 0
        for name in names:
            try:
                os.stat("Documents/users/" + name)
            except OSError as e:
                assert e.errno == errno.EMFILE, e
                refused += 1
        print(len(names), refused > 0, refused < \(Self.directories - 200))
        '
        """, in: home)
        XCTAssertEqual(user.output, "\(Self.directories) True True\n", "every name listed, some refused: \(user.error)")
        // Root, meanwhile, looks up 150 directories and writes a file in each: with the user's 400
        // directories held, that would be past the limit; with its share, it is not.
        syscall("""
        for index in range(150):
            os.stat('Documents/roots/d%d' % index)
            with open('Documents/roots/d%d/note' % index, 'w') as f:
                f.write('kept')
        """, errno: 0)
        XCTAssertEqual(sh("cat Documents/roots/d149/note"), "kept")

        // Once the kernel forgets them, the user's share is free again.
        sh("sync; echo 2 > /proc/sys/vm/drop_caches")
        let again = Shell.run("""
        setpriv --reuid=4242 --regid=4242 --clear-groups /usr/bin/python3 -c '
        import os
        for index in range(200):
            os.stat("Documents/users/d%d" % index)
        print("looked up")
        '
        """, in: home)
        XCTAssertEqual(again.output, "looked up\n", again.error)
    }

    func testAUserHoldingFilesOpenPastItsShareGetsEMFILEAndRootGoesOn() {
        // The user holds 400 files open (its own limit allows that) while root opens 150 and reads them.
        let result = Shell.run("""
        report=$(mktemp -d) && chmod 777 "$report"
        setpriv --reuid=4242 --regid=4242 --clear-groups /usr/bin/python3 -c '
        import errno, os, sys, time
        held, refused = [], 0
        for index in range(\(Self.directories)):
            try:
                held.append(open("Documents/files/f%d" % index, "rb"))
            except OSError as e:
                assert e.errno == errno.EMFILE, e
                refused += 1
        open(sys.argv[1] + "/user", "w").write("%s %s\\n" % (refused > 0, len(held) > 200))
        time.sleep(60)
        ' "$report" &
        user=$!
        for _ in $(seq 300); do [ -e "$report/user" ] && break; sleep 0.1; done
        python3 -c '
        kept = [open("Documents/files/f%d" % index, "rb") for index in range(150)]
        print("root read", kept[149].read().decode(), end="")
        '
        kill $user; wait $user 2>/dev/null
        cat "$report/user"; rm -rf "$report"
        """, in: home)
        XCTAssertEqual(result.output, "root read file 149\nTrue True\n", result.error)
    }
}
