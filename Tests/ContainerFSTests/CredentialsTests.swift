import CLinux
import Foundation
import XCTest

/// The credential switch around a passthrough registration (`FuseSession.openBacking`): the thread
/// writes as an unprivileged writer of the file's group, then has its own credentials back.
final class CredentialsTests: XCTestCase {
    /// This thread's effective capabilities and filesystem group, from /proc/thread-self/status.
    private func credentials() throws -> (effective: UInt64, filesystemGroup: String) {
        let status = try String(contentsOfFile: "/proc/thread-self/status", encoding: .utf8)
        func field(_ name: String) throws -> [Substring] {
            let line = try XCTUnwrap(status.split(separator: "\n").first { $0.hasPrefix(name + ":") })
            return line.dropFirst(name.count + 1).split(whereSeparator: \.isWhitespace)
        }
        let effective = try XCTUnwrap(UInt64(try field("CapEff").first ?? "", radix: 16))
        // Gid: real, effective, saved, filesystem.
        return (effective, String(try field("Gid")[3]))
    }

    func testARegistrationsThreadWritesAsTheFilesGroupWithoutFSETIDThenTakesItsOwnBack() throws {
        try XCTSkipIf(geteuid() != 0, "the switch sets another filesystem group, which needs root")
        let fsetid: UInt64 = 1 << 4
        let before = try credentials()
        XCTAssertNotEqual(before.effective & fsetid, 0, "root holds CAP_FSETID")
        var saved = clinux_credentials()
        XCTAssertEqual(clinux_write_as_group_without_fsetid(4242, &saved), 0, String(cString: strerror(errno)))
        let lowered = try credentials()
        clinux_restore_credentials(&saved)
        XCTAssertEqual(lowered.effective & fsetid, 0)
        XCTAssertEqual(lowered.effective | fsetid, before.effective, "only CAP_FSETID goes")
        XCTAssertEqual(lowered.filesystemGroup, "4242")
        let after = try credentials()
        XCTAssertEqual(after.effective, before.effective)
        XCTAssertEqual(after.filesystemGroup, before.filesystemGroup)
    }

    /// Each change commits new credentials in the kernel: a registration changes only what differs.
    func testWhatHoldsAlreadyIsLeftAsItIs() throws {
        try XCTSkipIf(geteuid() != 0, "the switch drops CAP_FSETID, which only root holds here")
        let fsetid: UInt64 = 1 << 4
        let before = try credentials()
        let group = try XCTUnwrap(gid_t(before.filesystemGroup))
        var outer = clinux_credentials()
        XCTAssertEqual(clinux_write_as_group_without_fsetid(group, &outer), 0, String(cString: strerror(errno)))
        XCTAssertEqual(outer.changed, UInt32(CLINUX_CHANGED_CAPABILITIES), "the group was the thread's already")
        // Lowered already: a second registration changes nothing, and its restore gives nothing back.
        var inner = clinux_credentials()
        XCTAssertEqual(clinux_write_as_group_without_fsetid(group, &inner), 0, String(cString: strerror(errno)))
        XCTAssertEqual(inner.changed, 0)
        clinux_restore_credentials(&inner)
        let lowered = try credentials()
        clinux_restore_credentials(&outer)
        XCTAssertEqual(lowered.effective & fsetid, 0)
        XCTAssertEqual(lowered.filesystemGroup, before.filesystemGroup)
        let after = try credentials()
        XCTAssertEqual(after.effective, before.effective)
        XCTAssertEqual(after.filesystemGroup, before.filesystemGroup)
    }

    func testASwitchThatCannotBeMadeIsRefusedAndChangesNothing() throws {
        // No filesystem group can be (gid_t)-1: the kernel leaves the group as it is.
        let before = try credentials()
        var saved = clinux_credentials()
        XCTAssertEqual(clinux_write_as_group_without_fsetid(gid_t.max, &saved), -1)
        XCTAssertEqual(errno, EPERM)
        let after = try credentials()
        XCTAssertEqual(after.effective, before.effective)
        XCTAssertEqual(after.filesystemGroup, before.filesystemGroup)
    }
}
