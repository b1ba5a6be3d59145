//! Every phrase the host logs (or answers a refused request with, or gives a dead letter)
//! that a test waits for or looks for, from one place. Each component keeps its own
//! catalogue, an `events` module beside the code that writes its lines — the
//! [`checkpoint`](crate::checkpoint)'s restore, the [`operator`](crate::operator), the
//! [`sink`](crate::sink)s, the [`source`](crate::source)s, the [`worker`](crate::worker)s,
//! the [`partitions`](crate::partitions), the [`warnings`](crate::warnings), the [`admin`](crate::admin) API and the
//! [`job`](crate::job) — and this module re-exports them all, so a test imports
//! `sluice::events::*` and a reworded phrase fails the tests' build, not a test at run
//! time. It owns no phrase itself, and nothing in the library imports it (it is last in
//! the layer chain): a component uses its own catalogue.

pub use crate::admin::events::*;
pub use crate::checkpoint::events::*;
pub use crate::job::events::*;
pub use crate::operator::events::*;
pub use crate::partitions::events::*;
pub use crate::sink::events::*;
pub use crate::source::events::*;
pub use crate::warnings::events::*;
pub use crate::worker::events::*;
