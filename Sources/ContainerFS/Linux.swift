import CLinux
import Glibc

// Swift names for the Linux constants that Glibc's module leaves out.
let O_PATH = clinux_O_PATH
let O_TMPFILE = clinux_O_TMPFILE
let O_DIRECT = clinux_O_DIRECT
let AT_EMPTY_PATH = clinux_AT_EMPTY_PATH
let UTIME_NOW = clinux_UTIME_NOW
let UTIME_OMIT = clinux_UTIME_OMIT
let RENAME_NOREPLACE = clinux_RENAME_NOREPLACE
let RENAME_EXCHANGE = clinux_RENAME_EXCHANGE
let SEEK_DATA = clinux_SEEK_DATA
let SEEK_HOLE = clinux_SEEK_HOLE
