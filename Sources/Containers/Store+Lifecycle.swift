/// The store's files that belong to the lifecycle: keys and seals.
///
///     STORE/keys/seal-signing.key    the store's Ed25519 key that signs seals (mode 0600, directory 0700)
///     STORE/apps/ID/seal.json        the bundle's manifest (every item, hashed)
///     STORE/apps/ID/seal.sig         the manifest's Ed25519 signature, base64
extension Store {
    public var keysPath: String { root + "/keys" }
    public var sealingKeyPath: String { keysPath + "/seal-signing.key" }
    public func sealManifestPath(_ id: AppID) -> String { recordDirectory(id) + "/seal.json" }
    public func sealSignaturePath(_ id: AppID) -> String { recordDirectory(id) + "/seal.sig" }
    public func inboxPath(_ id: AppID) -> String { containerPath(id) + "/" + ContainerLayout.inbox }
    public func tmpPath(_ id: AppID) -> String { containerPath(id) + "/" + ContainerLayout.tmp }
    public func cachesPath(_ id: AppID) -> String { containerPath(id) + "/" + ContainerLayout.caches }
}
