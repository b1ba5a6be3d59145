//! The `sluice` binary's commands, one module per family of them: [`run`], [`test`],
//! [`replay`], [`versions`] (deploy, rollback, versions), [`status`], [`checkpoints`], [`state`],
//! [`generate`], [`new`] and [`config`], over the grammar of them all in [`args`].
//!
//! The library does the work; each module here turns its family's arguments into calls
//! of it, and its answers into what the command prints and the error it ends with.
//! Nothing here is the library's: a job, a store or an operator is reached only through
//! `sluice::`, never the other way, and no command here calls another's.

pub mod args;
pub mod checkpoints;
pub mod config;
pub mod generate;
pub mod new;
pub mod replay;
pub mod run;
pub mod state;
pub mod status;
pub mod test;
pub mod versions;
