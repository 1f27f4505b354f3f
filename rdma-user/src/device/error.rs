//! The data path's typed errors: what a control call on [`super::datapath::Core`]
//! can fail with, and the errno rdma-core returns for the same failure (for
//! the verbs ABI). Packet errors are never errors here: they are counted.

use std::fmt;

use crate::memory::RegError;
use crate::transport::{ModifyError, PostError};

#[derive(Debug)]
pub enum DeviceError {
    NoQp(u32),
    NoCq(u32),
    /// No address handle with this number.
    NoAh(u32),
    AhLimit(usize),
    /// A CQ that a QP still uses (rdma-core: EBUSY).
    CqBusy(u32),
    /// No memory region with this lkey.
    NoMr(u32),
    QpLimit(usize),
    CqLimit(usize),
    MrLength {
        len: usize,
        max: usize,
    },
    /// A path's local and peer addresses are of different IP families.
    MixedFamilies,
    /// Shared memory for a region could not be had (memfd, mmap).
    Memory(String),
    /// A region in the MR pool, but this device has none (why).
    NoPool(String),
    /// The MR pool has no free range that large.
    PoolFull(crate::memory::PoolFull),
    Reg(RegError),
    Modify(ModifyError),
    Post(PostError),
}

impl DeviceError {
    /// The errno rdma-core's verbs return for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::NoQp(_)
            | DeviceError::NoCq(_)
            | DeviceError::NoMr(_)
            | DeviceError::NoAh(_) => libc::EINVAL,
            DeviceError::AhLimit(_) => libc::ENOMEM,
            DeviceError::CqBusy(_) => libc::EBUSY,
            DeviceError::QpLimit(_)
            | DeviceError::CqLimit(_)
            | DeviceError::Memory(_)
            | DeviceError::PoolFull(_) => libc::ENOMEM,
            DeviceError::NoPool(_) => libc::EOPNOTSUPP,
            DeviceError::Reg(RegError::TooMany { .. }) => libc::ENOMEM,
            DeviceError::Reg(_) | DeviceError::MrLength { .. } | DeviceError::MixedFamilies => {
                libc::EINVAL
            }
            DeviceError::Modify(_) => libc::EINVAL,
            DeviceError::Post(PostError::QueueFull) => libc::ENOMEM,
            DeviceError::Post(_) => libc::EINVAL,
        }
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::NoQp(q) => write!(f, "no QP {q:#x}"),
            DeviceError::NoCq(c) => write!(f, "no CQ {c}"),
            DeviceError::NoAh(a) => write!(f, "no address handle {a}"),
            DeviceError::AhLimit(n) => write!(f, "address handle limit reached ({n})"),
            DeviceError::CqBusy(c) => write!(f, "CQ {c} is still used by a QP"),
            DeviceError::NoMr(k) => write!(f, "no memory region with lkey {k:#x}"),
            DeviceError::QpLimit(n) => {
                write!(f, "QP limit reached ({n}); destroy a QP or raise --max-qp")
            }
            DeviceError::CqLimit(n) => write!(f, "CQ limit reached ({n})"),
            DeviceError::MrLength { len, max } => {
                write!(
                    f,
                    "memory region length {len} out of range (1..={max} bytes)"
                )
            }
            DeviceError::NoPool(why) => write!(
                f,
                "this device has no MR pool ({why}); register without --pool"
            ),
            DeviceError::PoolFull(e) => {
                write!(f, "{e}; deregister pool MRs or register without --pool")
            }
            DeviceError::MixedFamilies => {
                f.write_str("local and peer addresses must both be IPv4 or both IPv6")
            }
            DeviceError::Memory(e) => write!(f, "memory for the region: {e}"),
            DeviceError::Reg(e) => e.fmt(f),
            DeviceError::Modify(e) => e.fmt(f),
            DeviceError::Post(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for DeviceError {}

impl From<RegError> for DeviceError {
    fn from(e: RegError) -> Self {
        DeviceError::Reg(e)
    }
}
impl From<ModifyError> for DeviceError {
    fn from(e: ModifyError) -> Self {
        DeviceError::Modify(e)
    }
}
impl From<PostError> for DeviceError {
    fn from(e: PostError) -> Self {
        DeviceError::Post(e)
    }
}
