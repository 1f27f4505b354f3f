//! Tools built on the stack: perftest-style benchmarks ([`bench`]), same-link
//! baselines ([`baseline`]), rc_pingpong's protocol ([`pingpong`]), the
//! impairment relay ([`impair`], [`relay`]), the soak workload ([`soak`])
//! and the hostile-packet generator ([`hostile`]).
//!
//! The core (every other module of this crate) never imports these.

pub mod baseline;
pub mod bench;
pub mod hostile;
pub mod impair;
pub mod pingpong;
pub mod relay;
pub mod soak;
