import Glibc
import XCTest

/// Everyday tools and editors, as users run them.
final class ToolsTests: MountedTestCase {
    func testCoreutils() {
        sh("echo one > Documents/a && cp Documents/a Documents/b && mv Documents/b Documents/c && cat Documents/c")
        sh("cp -a Notes.app Documents/copy.app && diff -r Notes.app Documents/copy.app")
        XCTAssertEqual(sh("stat -c %A Documents/copy.app/Info.plist"), "-r--r--r--\n")
        sh("rm -rf Documents/copy.app")
        sh("touch Documents/t && ln Documents/t Documents/t2 && ln -s t Documents/t3 && rm Documents/t Documents/t2 Documents/t3")
        XCTAssertEqual(sh("echo x > Documents/x && chmod 600 Documents/x && stat -c %a Documents/x"), "600\n")
    }

    func testSedInPlaceAndPythonAtomicSave() {
        sh("sed -i 's/hello/goodbye/' Documents/hello.txt")
        XCTAssertEqual(sh("cat Documents/hello.txt"), "goodbye\n")
        sh("python3 -c \"import os; open('Documents/.t', 'w').write('saved'); os.replace('Documents/.t', 'Documents/hello.txt')\"")
        XCTAssertEqual(sh("cat Documents/hello.txt"), "saved")
    }

    func testTarCreateAndExtract() {
        sh("mkdir -p Documents/src/sub && echo a > Documents/src/a && echo b > Documents/src/sub/b && ln -s a Documents/src/l")
        sh("tar -C Documents -cf tmp/src.tar src && mkdir Documents/out && tar -C Documents/out -xf tmp/src.tar")
        sh("diff -r Documents/src Documents/out/src")
        XCTAssertEqual(sh("readlink Documents/out/src/l"), "a\n")
        sh("mkdir Documents/copy && tar -C Notes.app -cf - . | tar -C Documents/copy -xf - && diff -r Notes.app Documents/copy")
    }

    func testGitInsideDocuments() throws {
        try XCTSkipIf(Shell.run("command -v git").status != 0, "git is not installed (scripts/setup.sh installs it)")
        sh("""
        cd Documents && git init -q project && cd project && echo '# Notes' > README.md && git add README.md \
        && git -c user.name=Test -c user.email=test@example.com commit -qm 'First' \
        && echo more >> README.md && git -c user.name=Test -c user.email=test@example.com commit -qam 'Second' \
        && git gc -q && git fsck --no-progress && test "$(git log --oneline | wc -l)" = 2
        """)
    }

    func testVimStyleSave() throws {
        try XCTSkipIf(Shell.run("command -v vim.tiny || command -v vim").status != 0, "vim is not installed (scripts/setup.sh installs it)")
        sh("vim=$(command -v vim.tiny || command -v vim); $vim -u NONE -n -es -c '%s/hello/from vim/' -c 'wq' Documents/hello.txt")
        XCTAssertEqual(sh("cat Documents/hello.txt"), "from vim\n")
    }

    func testRsyncInAndOut() throws {
        try XCTSkipIf(Shell.run("command -v rsync").status != 0, "rsync is not installed (scripts/setup.sh installs it)")
        sh("rsync -a Notes.app/ Documents/synced/ && rsync -a --delete Documents/synced/ tmp/back/ && diff -r Notes.app tmp/back")
    }
}
