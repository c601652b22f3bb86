// swift-tools-version:6.0
import PackageDescription

// libFuzzer harness for the control-socket codec (docs/control-protocol.md).
//
// The root package exposes only `containerfs` and `FileCoordination`, not `Coordination`, and
// SwiftPM does not allow a target path outside the package. So `Sources/Coordination` here is a
// symlink to `../Sources/Coordination`: the fuzzer compiles the very same files, instrumented,
// and the root Package.swift stays as it is. Coordination needs DequeModule, hence the one
// dependency (the same range as the root package; SwiftPM's cache serves it).
let package = Package(
    name: "ContainerFSFuzz",
    dependencies: [
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
    ],
    targets: [
        .target(
            name: "Coordination",
            dependencies: [.product(name: "DequeModule", package: "swift-collections")],
            path: "Sources/Coordination"
        ),
        // Build with -sanitize=fuzzer: libFuzzer supplies main() and calls LLVMFuzzerTestOneInput.
        .executableTarget(name: "ControlCodecFuzzer", dependencies: ["Coordination"]),
        // Writes one valid frame of every ControlMessage type into corpus/ (swift run SeedGenerator).
        .executableTarget(name: "SeedGenerator", dependencies: ["Coordination"]),
    ],
    swiftLanguageModes: [.v5]
)
