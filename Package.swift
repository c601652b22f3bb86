// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "ContainerFS",
    products: [
        .executable(name: "containerfs", targets: ["containerfs"]),
        // The client library: FileCoordinator and FilePresenter for Linux.
        .library(name: "FileCoordination", targets: ["FileCoordination"]),
        // Apple's NS spellings of it, for code ported unchanged.
        .library(name: "NSFileCoordination", targets: ["NSFileCoordination"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
        .package(url: "https://github.com/apple/swift-crypto", "3.0.0"..<"5.0.0"),
    ],
    targets: [
        // libfuse3 and liburing from Debian (libfuse3-dev, liburing-dev: scripts/setup.sh installs them)
        // and the C shim over them.
        .target(name: "CFuse", linkerSettings: [.linkedLibrary("fuse3"), .linkedLibrary("uring")]),
        // Linux calls that Swift's Glibc module leaves out, and CRC-32C by ISA-L (Debian's
        // libisal-dev, which scripts/setup.sh installs).
        .target(name: "CLinux", linkerSettings: [.linkedLibrary("isal")]),
        // A thin Swift layer over libfuse's low-level API. Knows nothing about containers.
        .target(name: "FUSELowLevel", dependencies: ["CFuse", "CLinux"]),
        // Arbitration of coordinated reads and writes, presenters, the control protocol.
        .target(
            name: "Coordination",
            dependencies: [.product(name: "DequeModule", package: "swift-collections")]
        ),
        // The container model: store layout, policy, seals, lifecycle.
        .target(
            name: "Containers",
            dependencies: [
                "CLinux", .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "DequeModule", package: "swift-collections"),
            ]
        ),
        // The filesystem that joins the FUSE layer, coordination and the container model.
        .target(
            name: "ContainerFS",
            dependencies: [
                "CLinux", "FUSELowLevel", "Coordination", "Containers",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The client library for coordination-aware programs.
        .target(name: "FileCoordination", dependencies: ["CLinux", "Coordination", "Containers"]),
        .target(name: "NSFileCoordination", dependencies: ["FileCoordination"]),
        .executableTarget(
            name: "containerfs",
            dependencies: [
                "CLinux", "ContainerFS", "Containers", "FileCoordination",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .testTarget(name: "ContainersTests", dependencies: ["Containers"]),
        .testTarget(name: "CoordinationTests", dependencies: ["Coordination"]),
        .testTarget(name: "FileCoordinationTests", dependencies: ["FileCoordination", "Coordination"]),
        // Apple's documented pattern, compiled as written for Apple's systems plus one import.
        .testTarget(name: "NSFileCoordinationTests", dependencies: ["NSFileCoordination"]),
        .testTarget(name: "ContainerFSTests", dependencies: ["Containers", "ContainerFS", "containerfs", "FileCoordination"]),
    ],
    swiftLanguageModes: [.v6]
)
