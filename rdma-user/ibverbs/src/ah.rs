//! Address handles for UD (`ibv_create_ah`, `ibv_destroy_ah`,
//! `ibv_init_ah_from_wc`, `ibv_create_ah_from_wc`). An AH is the network
//! path to a GID: our GID at its source index, the peer's IP from the
//! destination GID and its MAC from the kernel's neighbour table (resolved
//! when missing, EHOSTUNREACH with a message after 3 s without an answer).
//! RoCE has no LIDs: an AH without a GRH is EINVAL, as with rxe.

use std::ffi::c_int;
use std::ptr;
use std::sync::Arc;

use rdma_user::transport::GRH_LEN;
use rdma_user::wire::{gid_of, gid_to_ip};

use crate::ffi::*;
use crate::objects::{open_context, our_context, Ah, CShared, AHS, PDS};
use crate::port::{gid_table, path_of};
use crate::{err_ptr, guard, set_errno};

/// # Safety
/// `pd` is a PD; `attr` points to an AH attr.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get(pd) else {
            return err_ptr(libc::EINVAL);
        };
        if attr.is_null() {
            return err_ptr(libc::EINVAL);
        }
        // SAFETY: the caller's attr.
        let a = unsafe { &*attr };
        if a.is_global == 0 || a.port_num > 1 {
            return err_ptr(libc::EINVAL);
        }
        let Some(ctx) = open_context(p.context()) else {
            return err_ptr(libc::EINVAL);
        };
        let path = match path_of(ctx.netdev(), a) {
            Ok(x) => x,
            Err(e) => return err_ptr(e),
        };
        match p.inner.create_ah(path) {
            Ok(inner) => AHS
                .add(Arc::new(Ah {
                    ah: CShared::new(ibv_ah {
                        context: p.context(),
                        pd,
                        handle: inner.handle,
                    }),
                    inner,
                    ctx,
                }))
                .cast(),
            Err(e) => err_ptr(e.errno()),
        }
    })
}

/// # Safety
/// `ah` is an AH.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    guard(libc::EIO, || {
        AHS.destroy(ah, libc::EINVAL, |a| {
            a.inner.destroy().map_err(|e| e.errno())
        })
        .err()
        .unwrap_or(0)
    })
}

/// The source and destination GIDs and the traffic class and flow label of
/// a received GRH, as rxe wrote it (an IPv4 header in the last 20 bytes,
/// or an IPv6 header).
fn grh_fields(grh: &[u8; GRH_LEN]) -> Option<([u8; 16], [u8; 16], u8, u32)> {
    let ip4 = &grh[20..];
    if ip4[0] == 0x45 {
        let (src, dst): ([u8; 4], [u8; 4]) =
            (ip4[12..16].try_into().ok()?, ip4[16..20].try_into().ok()?);
        let (s, d) = (gid_of(src.into()), gid_of(dst.into()));
        return Some((s, d, ip4[1], 0));
    }
    if grh[0] >> 4 == 6 {
        let w = u32::from_be_bytes(grh[0..4].try_into().ok()?);
        let s: [u8; 16] = grh[8..24].try_into().ok()?;
        let d: [u8; 16] = grh[24..40].try_into().ok()?;
        return Some((s, d, (w >> 20) as u8, w & 0xf_ffff));
    }
    None
}

/// The AH attributes that answer a received datagram: back to its source
/// GID, from our GID it was sent to. -1 with errno EINVAL for a completion
/// without a GRH or a GRH of neither IP version; ENOENT when the GID it
/// was sent to is not ours.
///
/// # Safety
/// `context` is a context; `wc`, `grh` and `ah_attr` point to their structs.
#[no_mangle]
pub unsafe extern "C" fn ibv_init_ah_from_wc(
    context: *mut ibv_context,
    port_num: u8,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    ah_attr: *mut ibv_ah_attr,
) -> c_int {
    guard(-1, || {
        let fail = |e| {
            set_errno(e);
            -1
        };
        let Some(ctx) = our_context(context) else {
            return fail(libc::EINVAL);
        };
        if wc.is_null() || grh.is_null() || ah_attr.is_null() || port_num != 1 {
            return fail(libc::EINVAL);
        }
        // SAFETY: the caller's completion and the 40 bytes of GRH it
        // received (an ibv_grh is exactly those bytes).
        let (w, g) = unsafe { (&*wc, &*(grh as *const [u8; GRH_LEN])) };
        if w.wc_flags & IBV_WC_GRH == 0 {
            return fail(libc::EINVAL);
        }
        let Some((sgid, dgid, tclass, flow)) = grh_fields(g) else {
            return fail(libc::EINVAL);
        };
        let gids = gid_table(ctx.netdev());
        let ours = gid_to_ip(&dgid);
        let Some(index) = gids.iter().position(|x| gid_to_ip(x) == ours) else {
            return fail(libc::ENOENT);
        };
        let a = ibv_ah_attr {
            grh: ibv_global_route {
                dgid: ibv_gid { raw: sgid },
                flow_label: flow,
                sgid_index: index as u8,
                hop_limit: 0xff,
                traffic_class: tclass,
            },
            dlid: w.slid,
            sl: w.sl,
            src_path_bits: w.dlid_path_bits,
            static_rate: 0,
            is_global: 1,
            port_num,
        };
        // SAFETY: the caller's attr.
        unsafe { ah_attr.write(a) };
        0
    })
}

/// # Safety
/// As `ibv_init_ah_from_wc`, with a PD.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    wc: *mut ibv_wc,
    grh: *mut ibv_grh,
    port_num: u8,
) -> *mut ibv_ah {
    guard(ptr::null_mut(), || {
        let Some(p) = PDS.get(pd) else {
            return err_ptr(libc::EINVAL);
        };
        let mut attr = ibv_ah_attr::default();
        // SAFETY: the same contract; attr is ours.
        if unsafe { ibv_init_ah_from_wc(p.context(), port_num, wc, grh, &mut attr) } != 0 {
            return ptr::null_mut();
        }
        // SAFETY: a PD of ours and an attr we filled.
        unsafe { ibv_create_ah(pd, &mut attr) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_fields_of_both_families() {
        // rxe's IPv4 GRH: 20 zero bytes, then the IPv4 header.
        let mut g = [0u8; GRH_LEN];
        g[20..40].copy_from_slice(&[
            0x45, 0x08, 0, 0x74, 0x32, 0xc3, 0x40, 0, 64, 17, 0xf2, 0xeb, 10, 99, 0, 3, 10, 99, 0,
            2,
        ]);
        let (s, d, tc, fl) = grh_fields(&g).unwrap();
        assert_eq!(gid_to_ip(&s).to_string(), "10.99.0.3");
        assert_eq!(gid_to_ip(&d).to_string(), "10.99.0.2");
        assert_eq!((tc, fl), (0x08, 0));
        let mut g = [0u8; GRH_LEN];
        g[0..4].copy_from_slice(&0x6123_4567u32.to_be_bytes());
        g[8..24].copy_from_slice(&[0xfd; 16]);
        g[24..40].copy_from_slice(&[0xfe; 16]);
        let (s, d, tc, fl) = grh_fields(&g).unwrap();
        assert_eq!((s, d, tc, fl), ([0xfd; 16], [0xfe; 16], 0x12, 0x34567));
        assert_eq!(grh_fields(&[0u8; GRH_LEN]), None);
    }
}
