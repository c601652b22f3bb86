// Apple's spellings of the client library, so that code written for Foundation on Apple's systems
// builds on Linux with one line added: `import NSFileCoordination` (docs/client-library.md,
// "Porting from Apple's API").
@_exported import FileCoordination

public typealias NSFileCoordinator = FileCoordinator
public typealias NSFilePresenter = FilePresenter
public typealias NSFileAccessIntent = FileAccessIntent
public typealias NSFileVersion = FileVersion
