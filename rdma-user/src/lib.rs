//! Software RoCEv2 over XDP/AF_XDP.
//!
//! The layers follow the data: [`io`] (XDP program, AF_XDP rings) ->
//! [`device`] (the data path loop) -> [`wire`] (parse) -> [`transport`] (the
//! sans-IO RC engine, split by role) -> [`memory`] (MRs) and completions.
//! [`control`] (the daemon) and [`verbs`] (the library API) sit beside the
//! data path and reach it only through jobs; [`tools`] (benchmarks, soak,
//! relay, hostile packets) use all of it and nothing above imports them.
//!
//! [`cm`] is the communication manager, sans-IO beside [`transport`].
//!
//! Allowed imports, lowest layer first (checked by `tests/layering.rs`):
//! `rng` <- `wire` <- `memory` <- `transport`, `cm` <- `io` <- `device` <-
//! `control`, `verbs` <- `tools`.

pub mod cm;
pub mod control;
pub mod device;
pub mod io;
pub mod memory;
pub mod rng;
pub mod tools;
pub mod transport;
pub mod verbs;
pub mod wire;
