import Foundation

/// The demo store: two apps with real bundles, documents, and files waiting in their Inboxes.
/// Everything is embedded here, so `containerfs mount --demo` works on a fresh machine.
public enum DemoStore {
    /// Where `--demo` keeps its store: `$XDG_DATA_HOME/containerfs/demo`, or `~/.local/share/containerfs/demo`.
    public static var defaultPath: String {
        let environment = ProcessInfo.processInfo.environment
        let data = environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 }
            ?? (NSHomeDirectory() + "/.local/share")
        return data + "/containerfs/demo"
    }

    /// Opens the demo store, creating it on first use. Changes made through a mount are kept.
    public static func prepare(at path: String = defaultPath) throws -> Store {
        if FileManager.default.fileExists(atPath: path + "/" + Store.markerName) { return try Store.open(path) }
        let store = try Store.openOrCreate(path)
        let staging = store.workPath + "/demo-bundles"
        try? FileManager.default.removeItem(atPath: staging)
        defer { try? FileManager.default.removeItem(atPath: staging) }
        for app in apps {
            let bundle = staging + "/" + app.bundleName
            try write(app.bundle, under: bundle)
            let id = AppID(app.id)!
            try Installer.install(bundle: bundle, into: store, id: id)
            try write(app.data, under: store.containerPath(id))
        }
        return store
    }

    private struct DemoApp {
        let id: String
        let bundleName: String
        let bundle: [String: Data]
        /// Files placed in the container after install, by path from its root (Inbox files included:
        /// the demo plays the part of the delivering program).
        let data: [String: Data]
    }

    private static func write(_ files: [String: Data], under root: String) throws {
        for (path, contents) in files {
            let full = root + "/" + path
            try FileManager.default.createDirectory(atPath: (full as NSString).deletingLastPathComponent,
                                                    withIntermediateDirectories: true)
            try contents.write(to: URL(fileURLWithPath: full))
            if contents.starts(with: Data("#!".utf8)) {
                try FileManager.default.setAttributes([.posixPermissions: 0o755], ofItemAtPath: full)
            }
        }
    }

    private static func text(_ string: String) -> Data { Data(string.utf8) }

    private static func infoPlist(id: String, name: String) -> Data {
        text("""
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">
        <dict>
            <key>CFBundleIdentifier</key>
            <string>\(id)</string>
            <key>CFBundleName</key>
            <string>\(name)</string>
            <key>CFBundleExecutable</key>
            <string>\(name)</string>
            <key>CFBundleShortVersionString</key>
            <string>1.0</string>
            <key>CFBundleIconFile</key>
            <string>AppIcon.png</string>
        </dict>
        </plist>

        """)
    }

    private static let icon = Data(base64Encoded: "iVBORw0KGgoAAAANSUhEUgAAACAAAAAgCAIAAAD8GO2jAAAHp0lEQVR42g3NIevyQADA4ffjWFZWLCsrlhkuOBhD0HBBQUTQcGEDGQMNFxTGGMxwQUFE0HBBQcbgv+C3+r0+X+D5x7fH1+Hr8u3z9fj6fAd8A76Cb8g35jvhK/nO+S75rvkqvinfjO+Or+Z75Fvyrfkavhe+N74Pvpbvm2/D9+8fXY/OoXPp+nQenU83oAvoBF1IF9NN6CTdnG5Jt6ZTdCldRrej03RHupKupjN0F7ob3YPO0r3pGrpf0PZoHVqXtk/r0fq0A9qAVtCGtDHthFbSzmmXtGtaRZvSZrQ7Wk17pC1pa1pDe6G90T5oLe2btqH9BZ8eH4ePy6fPx+Pj8xnwCfgIPiGfmM+Ej+Qz57Pks+aj+KR8Mj47PprPkU/Jp+Zj+Fz43Pg8+Fg+bz4Nn1/w6vFyeLm8+rw8Xj6vAa+Al+AV8op5TXhJXnNeS15rXopXyivjteOleR15lbxqXobXhdeN14OX5fXm1fD6BbaHdbAuto/1sD52gA2wAhtiY+wEK7Fz7BK7xipsis2wO6zGHrEltsYa7AV7wz6wFvvGNthf8OzxdHi6PPs8PZ4+zwHPgKfgGfKMeU54Sp5znkuea56KZ8oz47njqXkeeZY8a56G54XnjeeDp+X55tnw/AX3HneHu8u9z93j7nMfcA+4C+4h95j7hLvkPue+5L7mrrin3DPuO+6a+5F7yb3mbrhfuN+4P7hb7m/uDfdfcO1xdbi6XPtcPa4+1wHXgKvgGnKNuU64Sq5zrkuua66Ka8o147rjqrkeuZZca66G64XrjeuDq+X65tpw/QXnHmeHs8u5z9nj7HMecA44C84h55jzhLPkPOe85LzmrDinnDPOO86a85FzybnmbDhfON84Pzhbzm/ODedfYHoYB+Ni+hgP42MGmAAjMCEmxkwwEjPHLDFrjMKkmAyzw2jMEVNiaozBXDA3zANjMW9Mg/kFpx4nh5PLqc/J4+RzGnAKOAlOIaeY04ST5DTntOS05qQ4pZwyTjtOmtORU8mp5mQ4XTjdOD04WU5vTg2nX1D1qBwql6pP5VH5VAOqgEpQhVQx1YRKUs2pllRrKkWVUmVUOypNdaQqqWoqQ3WhulE9qCzVm6qh+gVFj8KhcCn6FB6FTzGgCCgERUgRU0woJMWcYkmxplAUKUVGsaPQFEeKkqKmMBQXihvFg8JSvCkail9w6HFwOLgc+hw8Dj6HAYeAg+AQcog5TDhIDnMOSw5rDopDyiHjsOOgORw5lBxqDobDhcONw4OD5fDm0HD4BbqHdtAuuo/20D56gA7QAh2iY/QELdFz9BK9Rit0is7QO7RGH9ElukYb9AV9Qz/QFv1GN+hfsO+xd9i77PvsPfY++wH7gL1gH7KP2U/YS/Zz9kv2a/aKfco+Y79jr9kf2Zfsa/aG/YX9jf2DvWX/Zt+w/wV5j9whd8n75B65Tz4gD8gFeUgek0/IJfmcfEm+JlfkKXlGviPX5EfykrwmN+QX8hv5g9ySv8kb8l+w7bF12Lps+2w9tj7bAduArWAbso3ZTthKtnO2S7ZrtoptyjZju2Or2R7Zlmxrtobthe2N7YOtZftm27D9BUmPxCFxSfokHolPMiAJSARJSBKTTEgkyZxkSbImUSQpSUayI9EkR5KSpCYxJBeSG8mDxJK8SRqSX6B6KAflovooD+WjBqgAJVAhKkZNUBI1Ry1Ra5RCpagMtUNp1BFVomqUQV1QN9QDZVFvVIP6BZseG4eNy6bPxmPjsxmwCdgINiGbmM2EjWQzZ7Nks2aj2KRsMjY7NprNkU3JpmZj2FzY3Ng82Fg2bzYNm1+w6rFyWLms+qw8Vj6rAauAlWAVsopZTVhJVnNWS1ZrVopVyipjtWOlWR1ZlaxqVobVhdWN1YOVZfVm1bD6BYseC4eFy6LPwmPhsxiwCFgIFiGLmMWEhWQxZ7FksWahWKQsMhY7FprFkUXJomZhWFxY3Fg8WFgWbxYNi18w6zFzmLnM+sw8Zj6zAbOAmWAWMouZTZhJZnNmS2ZrZopZyixjtmOmmR2ZlcxqZobZhdmN2YOZZfZm1jD7BbKHdJAuso/0kD5ygAyQAhkiY+QEKZFz5BK5RipkisyQO6RGHpElskYa5AV5Qz6QFvlGNshfMO0xdZi6TPtMPaY+0wHTgKlgGjKNmU6YSqZzpkuma6aKaco0Y7pjqpkemZZMa6aG6YXpjemDqWX6Ztow/QXjHmOHscu4z9hj7DMeMA4YC8Yh45jxhLFkPGe8ZLxmrBinjDPGO8aa8ZFxybhmbBhfGN8YPxhbxm/GDeNfEPWIHCKXqE/kEflEA6KASBCFRDHRhEgSzYmWRGsiRZQSZUQ7Ik10JCqJaiJDdCG6ET2ILNGbqCH6BaMeI4eRy6jPyGPkMxowChgJRiGjmNGEkWQ0Z7RktGakGKWMMkY7RprRkVHJqGZkGF0Y3Rg9GFlGb0YNo18geggH4SL6CA/hIwaIACEQISJGTBASMUcsEWuEQqSIDLFDaMQRUSJqhEFcEDfEA2ERb0SD+AXDHkOHocuwz9Bj6DMcMAwYCoYhw5jhhKFkOGe4ZLhmqBimDDOGO4aa4ZFhybBmaBheGN4YPhhahm+GDcO//53f+mqEItSyAAAAAElFTkSuQmCC")!
    private static let sunset = Data(base64Encoded: "iVBORw0KGgoAAAANSUhEUgAAADAAAAAgCAIAAADbtmxLAAAAt0lEQVR42s3CsQaCARiG0ffCvotoaGhoaGhoaGhoSJLklyRJkqQSJUWUFFFSREkRERERERER0dRtPMfRL+JC1TfqRtUn5kHVO+5F1SvhQ9Uz6UfVwwmg6p4KouqWDqHqmgmj6pKNoOqci6HqlE+g6lhwUHUoplG1L2VRtS3nUbWuFFG1qpZRtaxXUTW3Bqqm1kLVxDqoGlsPVUMboKpvI1T1bIKqrs1Q1bYFqpq2QlXDNqiq2Q71D/UcqdcCkLAnAAAAAElFTkSuQmCC")!
    private static let beach = Data(base64Encoded: "iVBORw0KGgoAAAANSUhEUgAAADAAAAAgCAIAAADbtmxLAAAAQklEQVR42u3OMQkAIBAAQOMYx9l0H8cQzs5GMIPg8MjBBbjSYqVShISEhISEhB6Hah+pCAn9F9ozUhESEhISErp0AG1XuKY8wUlqAAAAAElFTkSuQmCC")!

    private static let apps = [
        DemoApp(
            id: "com.example.notes",
            bundleName: "Notes.app",
            bundle: [
                "Info.plist": infoPlist(id: "com.example.notes", name: "Notes"),
                "Notes": text("#!/bin/sh\necho 'Notes 1.0: a demo app of ContainerFS'\n"),
                "AppIcon.png": icon,
                "en.lproj/Localizable.strings": text("\"new-note\" = \"New Note\";\n\"delete\" = \"Delete\";\n"),
                "fr.lproj/Localizable.strings": text("\"new-note\" = \"Nouvelle note\";\n\"delete\" = \"Supprimer\";\n"),
                "Templates/Meeting.md": text("# Meeting\n\nDate:\nAttendees:\n\n## Notes\n\n## Actions\n"),
            ],
            data: [
                "Documents/Welcome.md": text("""
                # Welcome to ContainerFS

                This is the Documents folder of the Notes app. Edit it with any editor:
                saves are published atomically, so readers never see half a file.

                Notes.app next to Documents is the app's sealed bundle: read-only.
                Documents/Inbox holds files other programs sent here: read them, move
                them out, or delete them.

                """),
                "Documents/Shopping List.txt": text("milk\nbread\ncoffee\n"),
                "Documents/Projects/ContainerFS.md": text("# ContainerFS\n\n- [x] mount app containers\n- [ ] coordinate writers\n"),
                "Documents/Inbox/Meeting Notes.txt": text("Sent from Mail: notes of Monday's meeting.\n"),
                "Documents/Inbox/report.csv": text("quarter,revenue\nQ1,100\nQ2,140\n"),
                "Library/Preferences/com.example.notes.plist": text("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\"><dict><key>SortOrder</key><string>modified</string></dict></plist>\n"),
                "Library/Application Support/index.json": text("{\"notes\": 3}\n"),
                "Library/Caches/thumbnails/Welcome.png": icon,
            ]
        ),
        DemoApp(
            id: "com.example.photos",
            bundleName: "Photos.app",
            bundle: [
                "Info.plist": infoPlist(id: "com.example.photos", name: "Photos"),
                "Photos": text("#!/bin/sh\necho 'Photos 1.0: a demo app of ContainerFS'\n"),
                "AppIcon.png": icon,
                "Filters/sepia.json": text("{\"name\": \"Sepia\", \"matrix\": [0.39, 0.77, 0.19]}\n"),
            ],
            data: [
                "Documents/Albums/Holiday/beach.png": beach,
                "Documents/Albums/Holiday/README.txt": text("Holiday 2026\n"),
                "Documents/Inbox/sunset.png": sunset,
                "Library/Preferences/com.example.photos.plist": text("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\"><dict/></plist>\n"),
            ]
        ),
    ]
}
