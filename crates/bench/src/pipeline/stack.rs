//! The packet stack of `corehop bench pipeline`: an emulated NIC ring of real Ethernet/IPv4/TCP
//! frames and four components that process them the way a multiserver network stack does.
//!
//! - **driver** (a source): walks the receive ring, checks each frame's Ethernet header and
//!   length, passes a descriptor on; paced to an offered rate if one is given.
//! - **ip**: verifies the IPv4 header checksum, version, protocol and destination.
//! - **tcp**: checks the segment is the next one in sequence, then copies the payload into
//!   its socket buffer while computing the TCP checksum over pseudo-header, header and data
//!   (lwIP's copy-and-checksum; the copy that dominates TCP's time in the paper).
//! - **app**: the receiving application; counts bytes and checks stream order.
//!
//! Messages are small `Copy` descriptors (sequence number and ring slot); frame bytes stay in
//! the shared, read-only ring, as NewtOS passes pointers into shared packet buffers.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use corehop_runtime::components::{Component, Outbox};
use corehop_runtime::sys;

pub const PAYLOAD: usize = 1460;
const ETH: usize = 14;
const IP: usize = 20;
const TCP: usize = 20;
pub const FRAME: usize = ETH + IP + TCP + PAYLOAD;
const RING: usize = 256;
const SRC_IP: [u8; 4] = [10, 0, 0, 2];
const DST_IP: [u8; 4] = [10, 0, 0, 1];
/// Frames a driver hands on per poll at most.
const DRIVER_BURST: usize = 32;

/// A received frame: its place in the stream and its slot in the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    pub seq: u64,
    pub slot: u32,
}

/// The receive ring: `RING` frames of one TCP stream, payload bytes from a fixed seed.
pub struct Ring {
    frames: Vec<[u8; FRAME]>,
}

fn fold(mut sum: u32) -> u16 {
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// One's-complement sum of `bytes` as big-endian 16-bit words, added to `sum`.
fn sum16(bytes: &[u8], mut sum: u32) -> u32 {
    let mut chunks = bytes.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    fold(sum) as u32
}

fn pseudo_header_sum(len: usize) -> u32 {
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&SRC_IP);
    pseudo[4..8].copy_from_slice(&DST_IP);
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&(len as u16).to_be_bytes());
    sum16(&pseudo, 0)
}

impl Ring {
    pub fn new() -> Arc<Ring> {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let frames = (0..RING)
            .map(|slot| {
                let mut f = [0u8; FRAME];
                f[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
                f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
                f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
                let ip = &mut f[ETH..ETH + IP];
                ip[0] = 0x45;
                ip[2..4].copy_from_slice(&((IP + TCP + PAYLOAD) as u16).to_be_bytes());
                ip[4..6].copy_from_slice(&(slot as u16).to_be_bytes());
                ip[8] = 64;
                ip[9] = 6;
                ip[12..16].copy_from_slice(&SRC_IP);
                ip[16..20].copy_from_slice(&DST_IP);
                let csum = !fold(sum16(ip, 0));
                ip[10..12].copy_from_slice(&csum.to_be_bytes());
                let seg = &mut f[ETH + IP..];
                seg[0..2].copy_from_slice(&40000u16.to_be_bytes());
                seg[2..4].copy_from_slice(&5001u16.to_be_bytes());
                seg[4..8].copy_from_slice(&((slot * PAYLOAD) as u32).to_be_bytes());
                seg[12] = 5 << 4;
                seg[13] = 0x18; // PSH, ACK
                seg[14..16].copy_from_slice(&65535u16.to_be_bytes());
                for b in seg[TCP..].iter_mut() {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    *b = state as u8;
                }
                let csum = !fold(sum16(seg, pseudo_header_sum(TCP + PAYLOAD)));
                seg[16..18].copy_from_slice(&csum.to_be_bytes());
                f
            })
            .collect();
        Arc::new(Ring { frames })
    }

    fn frame(&self, slot: u32) -> &[u8; FRAME] {
        &self.frames[slot as usize % RING]
    }
}

/// The driver: a source walking the ring, optionally paced to `rate` frames per second.
pub struct Driver {
    pub ring: Arc<Ring>,
    pub next: u64,
    pub rate: Option<f64>,
    pub start_ns: u64,
    pub bad: Arc<AtomicU64>,
}

impl Component for Driver {
    type In = ();
    type Out = Desc;

    fn handle(&mut self, _: (), _: &mut Outbox<Desc>) {}

    fn poll(&mut self, out: &mut Outbox<Desc>) -> bool {
        let mut burst = out.room().min(DRIVER_BURST);
        if let Some(rate) = self.rate {
            let due = ((sys::now_ns() - self.start_ns) as f64 * rate / 1e9) as u64;
            burst = burst.min(due.saturating_sub(self.next) as usize);
        }
        for _ in 0..burst {
            let slot = (self.next % RING as u64) as u32;
            let f = self.ring.frame(slot);
            // What the driver looks at: the frame is for us, IPv4, and the length is sane.
            if f[0..6] != [0x02, 0, 0, 0, 0, 1] || f[12..14] != [0x08, 0x00] {
                self.bad.fetch_add(1, Ordering::Relaxed);
            }
            out.push(Desc { seq: self.next, slot });
            self.next += 1;
        }
        true
    }
}

/// IPv4 input: header checksum and fields.
pub struct Ip {
    pub ring: Arc<Ring>,
    pub bad: Arc<AtomicU64>,
}

impl Component for Ip {
    type In = Desc;
    type Out = Desc;

    fn handle(&mut self, d: Desc, out: &mut Outbox<Desc>) {
        let ip = &self.ring.frame(d.slot)[ETH..ETH + IP];
        let ok = fold(sum16(ip, 0)) == 0xffff && ip[0] == 0x45 && ip[9] == 6 && ip[16..20] == DST_IP;
        if ok {
            out.push(d);
        } else {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// TCP input: in-sequence check, payload copy with checksum into the socket buffer.
pub struct Tcp {
    pub ring: Arc<Ring>,
    pub expected: Option<u64>,
    pub socket: Vec<u8>,
    pub at: usize,
    pub bad: Arc<AtomicU64>,
}

impl Tcp {
    pub fn new(ring: Arc<Ring>, bad: Arc<AtomicU64>) -> Tcp {
        Tcp { ring, expected: None, socket: vec![0; 64 * PAYLOAD], at: 0, bad }
    }
}

impl Component for Tcp {
    type In = Desc;
    type Out = Desc;

    fn handle(&mut self, d: Desc, out: &mut Outbox<Desc>) {
        let seg = &self.ring.frame(d.slot)[ETH + IP..];
        let seq = u32::from_be_bytes([seg[4], seg[5], seg[6], seg[7]]);
        let in_order = self.expected.is_none_or(|e| e == d.seq) && seq as usize == d.slot as usize * PAYLOAD;
        // Copy and checksum in one pass over the payload, as lwIP's copy does.
        let dst = &mut self.socket[self.at..self.at + PAYLOAD];
        let mut sum = sum16(&seg[..TCP], pseudo_header_sum(TCP + PAYLOAD));
        for (d, s) in dst.chunks_exact_mut(2).zip(seg[TCP..].chunks_exact(2)) {
            d.copy_from_slice(s);
            sum += u32::from(u16::from_be_bytes([s[0], s[1]]));
        }
        self.at = (self.at + PAYLOAD) % self.socket.len();
        if in_order && fold(sum) == 0xffff {
            self.expected = Some(d.seq + 1);
            out.push(d);
        } else {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The application: reads the stream, checks order.
pub struct App {
    pub bytes: u64,
    pub last: Option<u64>,
    pub bad: Arc<AtomicU64>,
}

impl Component for App {
    type In = Desc;
    type Out = ();

    fn handle(&mut self, d: Desc, _: &mut Outbox<()>) {
        if self.last.is_some_and(|l| d.seq != l + 1) {
            self.bad.fetch_add(1, Ordering::Relaxed);
        }
        self.last = Some(d.seq);
        self.bytes += PAYLOAD as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_frames_carry_valid_checksums_and_the_stages_accept_them() {
        let ring = Ring::new();
        let bad = Arc::new(AtomicU64::new(0));
        let mut ip = Ip { ring: ring.clone(), bad: bad.clone() };
        let mut tcp = Tcp::new(ring.clone(), bad.clone());
        let mut out = Vec::new();
        for seq in 0..(2 * RING as u64) {
            let d = Desc { seq, slot: (seq % RING as u64) as u32 };
            let mut o1 = outbox();
            ip.handle(d, &mut o1);
            let mut o2 = outbox();
            for d in drain(o1) {
                tcp.handle(d, &mut o2);
            }
            out.extend(drain(o2));
        }
        assert_eq!(bad.load(Ordering::Relaxed), 0);
        assert_eq!(out.len(), 2 * RING);
        // A skipped segment is refused by TCP.
        let mut o = outbox();
        tcp.handle(Desc { seq: 10_000, slot: 3 }, &mut o);
        assert_eq!(bad.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_corrupted_header_is_refused_by_ip() {
        let mut ring = Ring { frames: Ring::new().frames.clone() };
        ring.frames[0][ETH + 8] = 1; // TTL changed, checksum not updated
        let bad = Arc::new(AtomicU64::new(0));
        let mut ip = Ip { ring: Arc::new(ring), bad: bad.clone() };
        ip.handle(Desc { seq: 0, slot: 0 }, &mut outbox());
        assert_eq!(bad.load(Ordering::Relaxed), 1);
    }

    fn outbox() -> Outbox<Desc> {
        Outbox::default()
    }

    fn drain(o: Outbox<Desc>) -> Vec<Desc> {
        o.into_staged()
    }
}
