//! The phrases the admin API logs, and answers a refused request with, that a reader or a
//! test looks for: where it listens, the refusals counted rather than logged, and why a
//! request is refused. Each is written once, here, and used where its line or answer is
//! written (in `admin.rs`). [`crate::events`] re-exports them with every other component's
//! phrases.

/// Logged once the API listens: `admin API listening on http://127.0.0.1:PORT`.
pub const LISTENING: &str = "admin API listening on ";

/// In the line counting the refusals a window did not log one by one: `admin API: 95
/// more requests refused, not logged one by one (at most 5 per 10s are)`.
pub const REFUSALS_COUNTED: &str = "more requests refused, not logged one by one";

/// Why a request without the right token is refused.
pub const UNAUTHORIZED: &str = "this request needs the admin token";

/// Why a deploy or rollback is refused by a host that has no token.
pub const NO_TOKEN: &str = "this host has no admin token, so its API changes nothing";

/// Why a request a browser makes for another site is refused.
pub const CROSS_ORIGIN: &str = "the admin API is not for other sites' pages";

/// Why a question without the token naming a `Host` not this host's is refused.
pub const FOREIGN_HOST: &str = "is not a name of this host";
