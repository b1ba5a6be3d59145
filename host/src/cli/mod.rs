//! The `sluice` binary's commands, one module per family of them.
//!
//! The library does the work; each module here turns one family's arguments into calls
//! of it and its answers into what the command prints and the error it ends with.
//! Nothing here is the library's: a job, a store or an operator is reached only through
//! `sluice::`, never the other way, and no module here uses another's command.

pub mod args;
