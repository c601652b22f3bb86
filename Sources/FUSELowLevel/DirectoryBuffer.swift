import CFuse

/// Fills a `readdir` answer: as many entries as fit in the size the kernel asked for.
public struct DirectoryBuffer: ~Copyable {
    private let request: FuseRequest
    private let storage: UnsafeMutablePointer<CChar>
    private let capacity: Int
    public private(set) var used = 0

    public init(for request: FuseRequest, size: Int) {
        self.request = request
        self.capacity = size
        self.storage = .allocate(capacity: max(size, 1))
    }

    deinit { storage.deallocate() }

    /// Adds a plain entry. Returns false, adding nothing, when it does not fit.
    public mutating func add(name: UnsafePointer<CChar>, attributes: inout stat, nextOffset: off_t) -> Bool {
        let size = fuse_add_direntry(request.raw, storage + used, capacity - used, name, &attributes, nextOffset)
        guard used + size <= capacity else { return false }
        used += size
        return true
    }

    /// Adds an entry with its lookup answer (readdirplus). Returns false, adding nothing, when it does not fit.
    public mutating func add(name: UnsafePointer<CChar>, entry: inout fuse_entry_param, nextOffset: off_t) -> Bool {
        let size = fuse_add_direntry_plus(request.raw, storage + used, capacity - used, name, &entry, nextOffset)
        guard used + size <= capacity else { return false }
        used += size
        return true
    }

    /// Whether an entry of this name would still fit, so that a lookup is not made in vain.
    public func fits(nameLength: Int, plus: Bool) -> Bool {
        // fuse_dirent is 24 bytes, fuse_direntplus adds a 128-byte entry_out; names pad to 8.
        let header = plus ? 152 : 24
        return used + header + ((nameLength + 7) & ~7) <= capacity
    }

    public consuming func send() {
        request.reply(buffer: UnsafeRawBufferPointer(start: storage, count: used))
    }
}
