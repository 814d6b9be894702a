//! The IPAM against the real filesystem, through the library (no root): the
//! configuration parser (`config`), store semantics (`store`), many OS processes and
//! SIGKILLs against one store (`process`), delegation to the reference `host-local`
//! (`delegate`); `common` has what they share.

#![allow(clippy::panic, reason = "tests fail by panicking with a message")]

mod common;

mod config;
mod delegate;
mod process;
mod store;
