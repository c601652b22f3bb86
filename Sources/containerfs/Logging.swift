import Foundation
import Logging

enum Logging {
    /// Logs go to stderr in the foreground and to syslog once the daemon runs in the background.
    static func bootstrap(debug: Bool, toSyslog: Bool) {
        let level: Logger.Level = debug ? .debug : .info
        LoggingSystem.bootstrap { label in
            var handler: LogHandler = toSyslog ? SyslogLogHandler(label: label) : StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}

struct SyslogLogHandler: LogHandler {
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    init(label: String) {
        self.label = label
        openlog("containerfs", LOG_PID, LOG_DAEMON)
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        let details = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        let text = details.isEmpty ? "\(event.message)" : "\(event.message) \(details)"
        let priority: Int32
        switch event.level {
        case .trace, .debug: priority = LOG_DEBUG
        case .info, .notice: priority = LOG_INFO
        case .warning: priority = LOG_WARNING
        case .error: priority = LOG_ERR
        case .critical: priority = LOG_CRIT
        }
        withVaList([text]) { vsyslog(priority, "%s", $0) }
    }
}
