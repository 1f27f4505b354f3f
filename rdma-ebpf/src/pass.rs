//! A pass-through XDP program for the far end of a veth pair.
//!
//! veth delivers a frame sent with `XDP_TX` (our XDP responder's ACKs) to
//! its peer's XDP receive ring, and the kernel schedules that ring's poll
//! only when the peer runs an XDP program: without one the frame is dropped
//! (`xdp_tx_errors`) or left in the ring. This program gives the peer one
//! and passes every frame to its stack unchanged.
#![no_std]
#![no_main]

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

#[xdp(frags)]
pub fn xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
