import Coordination
import Foundation

// Writes one valid frame of every ControlMessage type (a few types twice, for their optional
// fields and variants) into the corpus: `swift run SeedGenerator corpus` in Fuzz/.
// Files are named `valid-<type>-<n>`; CorpusReplayTests requires these to decode and re-encode
// to the same bytes.

func path(_ string: String) -> ItemPath { ItemPath(string)! }

let odd = PathComponent(bytes: [0x66, 0xFF, 0xFE, 0x22, 0x5C])!  // not UTF-8, with " and \
let weird = path("Documents").appending(odd)
let key = PresenterKey(owner: OwnerID(7), purpose: PurposeID("p"))

let seeds: [(String, ControlMessage)] = [
    ("hello", .hello(.init(clientName: "notes-sync", processID: 4242))),
    ("hello", .hello(.init(clientName: ""))),
    ("helloReply", .helloReply(.init(clientID: OwnerID(7)))),
    ("addPresenter", .addPresenter(.init(presenter: PurposeID("A1"), path: weird))),
    ("addPresenter", .addPresenter(.init(presenter: PurposeID("root"), path: .root))),
    ("removePresenter", .removePresenter(.init(presenter: PurposeID("A1")))),
    ("coordinate", .coordinate(.init(requestID: 1, purpose: PurposeID("c"), accesses: [
        .write(path("Documents/a.txt"), options: .forMoving),
        .write(path("Documents/b.txt"), options: [.forReplacing, .forMerging, .forDeleting]),
        .read(path("Documents/Talk.key"), isDirectory: true, options: [.withoutChanges, .forUploading]),
        .read(path("Documents/plain"), options: []),
    ], timeoutMilliseconds: 2500))),
    ("coordinate", .coordinate(.init(requestID: UInt64.max, purpose: PurposeID("ü"), accesses: []))),
    ("granted", .granted(.init(requestID: 1))),
    ("denied", .denied(.init(requestID: 1, reason: .timedOut, detail: "waited 2.5 s"))),
    ("denied", .denied(.init(requestID: 2, reason: .accessDenied))),
    ("release", .release(.init(requestID: 1))),
    ("cancel", .cancel(.init(requestID: 2))),
    ("presenterMessage", .presenterMessage(.init(messageID: MessageID(9), presenter: PurposeID("A1"),
                                                 message: .presentedSubitemDidMove(from: weird, to: path("Archive/x"))))),
    ("presenterMessage", .presenterMessage(.init(messageID: MessageID(10), presenter: PurposeID("A1"),
                                                 message: .relinquishPresentedItemToWriter))),
    ("presenterMessage", .presenterMessage(.init(messageID: MessageID(11), presenter: PurposeID("B"),
                                                 message: .presentedItemDidMove(to: path("Archive/y"))))),
    ("presenterReply", .presenterReply(.init(messageID: MessageID(9)))),
    ("presenterReply", .presenterReply(.init(messageID: MessageID(10), error: "could not save"))),
    ("statusRequest", .statusRequest),
    ("statusReply", .statusReply(CoordinationStatus(
        accesses: [AccessStatus(ticket: AccessTicket(3), state: .waiting, owner: OwnerID(7),
                                purpose: PurposeID("c"), kind: .write(.forDeleting), path: weird,
                                isDirectory: true)],
        presenters: [PresenterRecord(key: key, path: .root, isUnresponsive: true)],
        pendingMessages: [PendingMessageStatus(id: MessageID(4), presenter: key,
                                               message: .accommodatePresentedSubitemDeletion(at: weird))],
        clients: [ClientStatus(owner: OwnerID(7), clientName: "notes-sync", processID: 4242, userID: 1000, groupID: 1000)],
        writeSessions: [WriteSessionStatus(path: path("Documents/a.txt"), processIDs: [4242], shadowBytes: 12, inPlace: false)]))),
    ("statusReply", .statusReply(CoordinationStatus())),
    ("error", .error(.init(code: .protocolViolation, message: "hello first"))),
]

let directory = URL(fileURLWithPath: CommandLine.arguments.dropFirst().first ?? "corpus", isDirectory: true)
try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
var counts: [String: Int] = [:]
for (type, message) in seeds {
    counts[type, default: 0] += 1
    let frame = try ControlCodec.encode(message)
    let decoded = try ControlCodec.decode(frame: frame)
    precondition(decoded == message, "\(type) does not round-trip")
    let file = directory.appendingPathComponent("valid-\(type)-\(counts[type]!)")
    try Data(frame).write(to: file)
    print(file.lastPathComponent, frame.count, "bytes")
}
print(counts.count, "types,", seeds.count, "seeds")
