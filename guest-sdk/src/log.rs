//! Logging into the host's log, tagged there with the operator and partition.
//! Outside the sandbox, lines go to stderr.

/// How important a line is.
pub use super::wit_log::Level;

/// Logs `message` at `level`.
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    super::wit_log::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("{level:?}: {message}");
}

/// Logs at info level.
pub fn info(message: &str) {
    log(Level::Info, message)
}

/// Logs at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message)
}

/// Logs at error level.
pub fn error(message: &str) {
    log(Level::Error, message)
}
