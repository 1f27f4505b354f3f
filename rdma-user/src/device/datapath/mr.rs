//! Protection domains and memory regions: registration of fresh shared
//! memory, of application memory and of another data path's MRs. (Pool MRs,
//! which the XDP responder may write, are registered in `xdp_responder`.)

use super::{Core, Result};
use crate::device::error::DeviceError;
use crate::io::xsk::SharedMem;
use crate::memory::{Access, Backing};

impl Core {
    /// An MR is 1 byte to the device's `max_mr_len`.
    pub(super) fn check_mr_len(&self, len: usize) -> Result<()> {
        if len == 0 || len > self.limits.max_mr_len {
            return Err(DeviceError::MrLength {
                len,
                max: self.limits.max_mr_len,
            });
        }
        Ok(())
    }

    pub fn alloc_pd(&mut self) -> u32 {
        let pd = self.next_pd;
        self.next_pd += 1;
        pd
    }

    /// Registers `len` bytes of fresh shared memory (a memfd mapping, which
    /// another process may map too). The VA peers use is the mapping address.
    pub fn reg_mr(&mut self, pd: u32, len: usize, access: Access) -> Result<(u64, u32, u32)> {
        self.check_mr_len(len)?;
        let shm =
            SharedMem::new("rdma-mr", len).map_err(|e| DeviceError::Memory(format!("{e:#}")))?;
        let addr = shm.as_ptr() as u64;
        // SAFETY: the mapping is `len` bytes and lives in `mr_backing`
        // until `dereg_mr` removes the registration first.
        let backing = unsafe { Backing::raw(shm.as_ptr(), len) };
        let (lkey, rkey) = self.mem.register(pd, backing, addr, access)?;
        self.mr_backing.insert(lkey, shm);
        Ok((addr, lkey, rkey))
    }

    /// Registers memory the caller owns (`ibv_reg_mr` on application
    /// memory): the engine reads and writes it in place. Peers address it
    /// by `iova`.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays mapped and writable until `dereg_mr`.
    pub unsafe fn reg_mr_raw(
        &mut self,
        pd: u32,
        ptr: *mut u8,
        len: usize,
        iova: u64,
        access: Access,
    ) -> Result<(u32, u32)> {
        self.check_mr_len(len)?;
        // SAFETY: the caller promises the range stays mapped and writable
        // until `dereg_mr`.
        let backing = unsafe { Backing::raw(ptr, len) };
        Ok(self.mem.register(pd, backing, iova, access)?)
    }

    /// Registers another data path's MR here, same memory and keys (the
    /// daemon's data paths all see every MR).
    ///
    /// # Safety
    ///
    /// `ptr` must stay valid for `len` bytes until this registration is
    /// removed with [`Core::dereg_mr`]. Two data paths may then copy into
    /// the same bytes at once, as two QPs of a NIC may: what lands there
    /// is the applications' race, as on hardware.
    pub unsafe fn mirror_mr(
        &mut self,
        pd: u32,
        ptr: *mut u8,
        len: usize,
        access: Access,
        lkey: u32,
        rkey: u32,
    ) -> Result<()> {
        // SAFETY: the caller promises `len` valid bytes until `dereg_mr`.
        let backing = unsafe { Backing::raw(ptr, len) };
        Ok(self
            .mem
            .register_at(pd, backing, ptr as u64, access, (lkey, rkey))?)
    }
    pub fn dereg_mr(&mut self, lkey: u32) -> Result<()> {
        if self.mem.by_lkey(lkey).is_none() {
            return Err(DeviceError::NoMr(lkey));
        }
        self.release_pool_mr(lkey);
        self.mem.deregister(lkey).ok_or(DeviceError::NoMr(lkey))?;
        self.mr_backing.remove(&lkey);
        Ok(())
    }
}
