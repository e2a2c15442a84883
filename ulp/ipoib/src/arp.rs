//! The part of Linux's `net/ipv4/arp.c` and `net/core/neighbour.c` an IPoIB device needs: ARP packets with hardware type 32 (RFC 4391 section 9.1.1) and a neighbour table with Linux's NUD states, timed by the caller's clock.
//!
//! Left out: proxy ARP, `arp_accept`/`arp_ignore`/`arp_announce` policies
//! other than Linux's defaults, duplicate address detection (a probe from
//! 0.0.0.0 is counted and left unanswered), gratuitous announcements,
//! administratively set (PERMANENT/NOARP) entries, and the randomised
//! reachable time (a fixed [`crate::Config::reachable_us`]).
//!
//! The table is plain data: [`NeighTable::output`] is what the transmit
//! path asks of a next hop (`neigh_event_send`), the `arp_*` methods are
//! what a received ARP packet does to it (`arp_process`), and
//! [`NeighTable::timers`] runs the state machine (`neigh_timer_handler`),
//! handing back the requests to send and the entries that failed. Upper
//! layers' reachability confirmations (TCP's `dst_confirm`) are replaced
//! by [`NeighTable::confirm`], called for IPv4 traffic received from the
//! neighbour's QPN.

use alloc::vec::Vec;

use net::{Ipv4Address, NeighState, Neighbour};

use crate::{Config, INFINIBAND_ALEN, IpoibAddr};

/// `ARPHRD_INFINIBAND`.
pub const ARPHRD_INFINIBAND: u16 = 32;
/// `ARPOP_REQUEST`.
pub const ARPOP_REQUEST: u16 = 1;
/// `ARPOP_REPLY`.
pub const ARPOP_REPLY: u16 = 2;
/// Bytes of an IPoIB ARP packet: 8 of header, then two 20-byte hardware
/// addresses and two IPv4 addresses.
pub const ARP_LEN: usize = 8 + 2 * (INFINIBAND_ALEN + 4);

/// An ARP packet over IPoIB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArpPacket {
    /// Request or reply.
    pub op: u16,
    /// Sender hardware address.
    pub sha: IpoibAddr,
    /// Sender IP address.
    pub sip: Ipv4Address,
    /// Target hardware address (zero in a broadcast request).
    pub tha: IpoibAddr,
    /// Target IP address.
    pub tip: Ipv4Address,
}

/// Why an ARP packet was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpError {
    /// Fewer than [`ARP_LEN`] bytes.
    Short,
    /// A hardware type other than 32.
    HwType(u16),
    /// A protocol other than IPv4.
    Proto(u16),
    /// Address lengths other than 20 and 4.
    Lengths(u8, u8),
    /// An operation other than request and reply.
    Op(u16),
}

fn ip_at(b: &[u8], off: usize) -> Ipv4Address {
    Ipv4Address::new(b[off], b[off + 1], b[off + 2], b[off + 3])
}

impl ArpPacket {
    /// Parses the ARP packet at the front of `b` (trailing bytes are
    /// padding). Never panics.
    pub fn parse(b: &[u8]) -> Result<ArpPacket, ArpError> {
        let b = b.get(..ARP_LEN).ok_or(ArpError::Short)?;
        let hrd = u16::from_be_bytes([b[0], b[1]]);
        let pro = u16::from_be_bytes([b[2], b[3]]);
        if hrd != ARPHRD_INFINIBAND {
            return Err(ArpError::HwType(hrd));
        }
        if pro != crate::ETH_P_IP {
            return Err(ArpError::Proto(pro));
        }
        if usize::from(b[4]) != INFINIBAND_ALEN || b[5] != 4 {
            return Err(ArpError::Lengths(b[4], b[5]));
        }
        let op = u16::from_be_bytes([b[6], b[7]]);
        if op != ARPOP_REQUEST && op != ARPOP_REPLY {
            return Err(ArpError::Op(op));
        }
        let addr = |off: usize| IpoibAddr::from_bytes(&b[off..]).ok_or(ArpError::Short);
        Ok(ArpPacket {
            op,
            sha: addr(8)?,
            sip: ip_at(b, 28),
            tha: addr(32)?,
            tip: ip_at(b, 52),
        })
    }

    /// Writes the packet into `out` (at least [`ARP_LEN`] bytes) and
    /// returns its length; 0 if `out` is too short.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let Some(b) = out.get_mut(..ARP_LEN) else {
            return 0;
        };
        b[0..2].copy_from_slice(&ARPHRD_INFINIBAND.to_be_bytes());
        b[2..4].copy_from_slice(&crate::ETH_P_IP.to_be_bytes());
        b[4] = INFINIBAND_ALEN as u8;
        b[5] = 4;
        b[6..8].copy_from_slice(&self.op.to_be_bytes());
        b[8..28].copy_from_slice(&self.sha.0);
        b[28..32].copy_from_slice(&self.sip.octets());
        b[32..52].copy_from_slice(&self.tha.0);
        b[52..56].copy_from_slice(&self.tip.octets());
        ARP_LEN
    }
}

/// What [`process`] made of a received ARP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Refused: a sender address that is not a unicast IPoIB address, a
    /// multicast or broadcast target, a sender IP that cannot be a
    /// neighbour's.
    Bad,
    /// A duplicate-address probe (sender IP 0.0.0.0): not answered.
    Probe,
    /// Our own packet, or someone claiming our address: nothing learned.
    Own,
    /// A request for one of our addresses: the sender learned (STALE);
    /// answer it with a reply to its address.
    Answer,
    /// A request for someone else: an entry we hold took the address.
    Seen,
    /// A reply to a request of ours: the entry is REACHABLE.
    Reply,
    /// A reply nobody asked for (or not to us): dropped, nothing created
    /// (Linux's `arp_accept` 0).
    Unsolicited,
}

/// Linux `arp_process`'s decisions for an ARP packet `p` received on an
/// IPoIB device whose hardware address is `hw` and whose addresses
/// `ours` says, applied to `neighs` at `now` (`busy`: an address with
/// packets waiting for it). The device sends what [`Verdict::Answer`]
/// asks and counts the rest.
pub fn process(
    neighs: &mut NeighTable,
    p: &ArpPacket,
    hw: &IpoibAddr,
    ours: &dyn Fn(&Ipv4Address) -> bool,
    now: u64,
    busy: &dyn Fn(&Ipv4Address) -> bool,
) -> Verdict {
    if !p.sha.is_valid_unicast() || p.tip.is_multicast() || p.tip.is_broadcast() {
        return Verdict::Bad;
    }
    if p.sip.is_unspecified() {
        return Verdict::Probe;
    }
    if !is_unicast_ip(&p.sip) {
        return Verdict::Bad;
    }
    if p.sha == *hw || ours(&p.sip) {
        return Verdict::Own;
    }
    let for_us = ours(&p.tip);
    match p.op {
        ARPOP_REQUEST if for_us => {
            neighs.arp_request_for_us(p.sip, p.sha, now, busy);
            Verdict::Answer
        }
        ARPOP_REQUEST => {
            neighs.arp_seen(p.sip, p.sha, now);
            Verdict::Seen
        }
        _ if for_us && neighs.arp_reply(p.sip, p.sha, now).is_some() => Verdict::Reply,
        _ => Verdict::Unsolicited,
    }
}

/// Whether `a` can be a neighbour's address (ARP from or about it is
/// refused otherwise): not 0.0.0.0, broadcast, multicast, loopback or in
/// 0.0.0.0/8.
pub fn is_unicast_ip(a: &Ipv4Address) -> bool {
    !(a.is_unspecified()
        || a.is_broadcast()
        || a.is_multicast()
        || a.is_loopback()
        || a.octets()[0] == 0)
}

/// One neighbour (`struct neighbour` with its IPoIB hardware address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neigh {
    /// Its IPv4 address.
    pub ip: Ipv4Address,
    /// Its hardware address, once resolved.
    pub addr: Option<IpoibAddr>,
    /// Where resolution stands.
    pub state: NeighState,
    /// Last confirmation (an ARP reply, IPv4 from it).
    pub confirmed_us: u64,
    /// Last use by the transmit path.
    pub used_us: u64,
    /// When the state last changed.
    pub updated_us: u64,
    /// Requests sent in the current state.
    pub probes: u32,
    /// When the state machine looks at the entry next.
    pub next_us: u64,
}

/// What the transmit path may do with a packet for a next hop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Send it to this address.
    Send(IpoibAddr),
    /// Hold it: resolution is under way (a request goes out at the next
    /// [`NeighTable::timers`]).
    Hold,
    /// No room in the table for a new entry: drop it.
    NoRoom,
}

/// What [`NeighTable::timers`] asks the link to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send an ARP request for `ip`: broadcast (`to` None) or a unicast
    /// probe to the address the entry has.
    Request {
        /// Whom it asks about.
        ip: Ipv4Address,
        /// Unicast to this address, or broadcast.
        to: Option<IpoibAddr>,
    },
    /// Resolution of `ip` failed: drop what waits for it.
    Failed {
        /// The neighbour.
        ip: Ipv4Address,
    },
}

/// What a received ARP packet did to the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// Nothing (an entry we do not hold, an address unchanged).
    Nothing,
    /// The entry for this address has a hardware address now (new or
    /// changed): what waits for it can go.
    Resolved(Ipv4Address),
}

/// The neighbour table of one link (`arp_tbl` restricted to it).
#[derive(Clone, Debug)]
pub struct NeighTable {
    entries: Vec<Neigh>,
    max: usize,
}

impl NeighTable {
    /// An empty table of at most `max` entries.
    pub fn new(max: usize) -> NeighTable {
        NeighTable {
            entries: Vec::with_capacity(max),
            max: max.max(1),
        }
    }

    /// The entry for `ip`.
    pub fn get(&self, ip: &Ipv4Address) -> Option<&Neigh> {
        self.entries.iter().find(|n| n.ip == *ip)
    }

    fn get_mut(&mut self, ip: &Ipv4Address) -> Option<&mut Neigh> {
        self.entries.iter_mut().find(|n| n.ip == *ip)
    }

    /// Every entry.
    pub fn iter(&self) -> impl Iterator<Item = &Neigh> {
        self.entries.iter()
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The lines of `ip neigh`.
    pub fn for_each(&self, f: &mut dyn FnMut(&Neighbour)) {
        for n in &self.entries {
            f(&Neighbour {
                addr: n.ip,
                lladdr: n.addr.map(|a| a.hw()),
                state: n.state,
            });
        }
    }

    /// A new entry for `ip`, making room by dropping the least recently
    /// used STALE or FAILED entry if the table is full (`None`: no room).
    fn insert(&mut self, n: Neigh, busy: &dyn Fn(&Ipv4Address) -> bool) -> Option<&mut Neigh> {
        if self.entries.len() >= self.max {
            let victim = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| {
                    matches!(e.state, NeighState::Stale | NeighState::Failed) && !busy(&e.ip)
                })
                .min_by_key(|(_, e)| e.used_us.max(e.updated_us))
                .map(|(i, _)| i)?;
            self.entries.swap_remove(victim);
        }
        self.entries.push(n);
        self.entries.last_mut()
    }

    /// `neigh_event_send` for a packet to `ip` at `now`: the address to
    /// send to, or hold the packet while an INCOMPLETE entry (new, or
    /// restarted from FAILED) asks; a STALE entry is used and its probe
    /// scheduled (DELAY). `busy` says which entries still have packets
    /// held (those are not evicted).
    pub fn output(
        &mut self,
        ip: Ipv4Address,
        now: u64,
        cfg: &Config,
        busy: &dyn Fn(&Ipv4Address) -> bool,
    ) -> Output {
        if let Some(n) = self.get_mut(&ip) {
            n.used_us = now;
            return match (n.state, n.addr) {
                (NeighState::Stale, Some(a)) => {
                    n.state = NeighState::Delay;
                    n.updated_us = now;
                    n.next_us = now + cfg.delay_probe_us;
                    Output::Send(a)
                }
                (NeighState::Reachable | NeighState::Delay | NeighState::Probe, Some(a)) => {
                    Output::Send(a)
                }
                (NeighState::Incomplete, _) => Output::Hold,
                _ => {
                    // FAILED (or an entry with no address): ask again.
                    n.state = NeighState::Incomplete;
                    n.addr = None;
                    n.probes = 0;
                    n.updated_us = now;
                    n.next_us = now;
                    Output::Hold
                }
            };
        }
        let n = Neigh {
            ip,
            addr: None,
            state: NeighState::Incomplete,
            confirmed_us: 0,
            used_us: now,
            updated_us: now,
            probes: 0,
            next_us: now,
        };
        match self.insert(n, busy) {
            Some(_) => Output::Hold,
            None => Output::NoRoom,
        }
    }

    /// An ARP request for one of our addresses from `ip` at `addr`
    /// (`neigh_event_ns`): the sender becomes a STALE entry (created if
    /// need be), or keeps its state if its address is unchanged.
    pub fn arp_request_for_us(
        &mut self,
        ip: Ipv4Address,
        addr: IpoibAddr,
        now: u64,
        busy: &dyn Fn(&Ipv4Address) -> bool,
    ) -> Learned {
        if self.get(&ip).is_none() {
            let n = Neigh {
                ip,
                addr: Some(addr),
                state: NeighState::Stale,
                confirmed_us: 0,
                used_us: now,
                updated_us: now,
                probes: 0,
                next_us: now,
            };
            return match self.insert(n, busy) {
                Some(_) => Learned::Resolved(ip),
                None => Learned::Nothing,
            };
        }
        self.update(ip, addr, NeighState::Stale, now)
    }

    /// Another ARP packet from `ip` at `addr` (a request for someone
    /// else, a broadcast reply): an entry we hold takes the address (STALE
    /// if it changed); none is created.
    pub fn arp_seen(&mut self, ip: Ipv4Address, addr: IpoibAddr, now: u64) -> Learned {
        if self.get(&ip).is_none() {
            return Learned::Nothing;
        }
        self.update(ip, addr, NeighState::Stale, now)
    }

    /// An ARP reply from `ip` at `addr` to us: the entry becomes
    /// REACHABLE. `None` when no entry asked about `ip` (an unsolicited
    /// reply: Linux creates no entry for one, `arp_accept` 0).
    pub fn arp_reply(&mut self, ip: Ipv4Address, addr: IpoibAddr, now: u64) -> Option<Learned> {
        self.get(&ip)?;
        let l = self.update(ip, addr, NeighState::Reachable, now);
        if let Some(n) = self.get_mut(&ip) {
            n.confirmed_us = now;
            n.state = NeighState::Reachable;
            n.probes = 0;
        }
        Some(l)
    }

    /// `neigh_update` of an existing entry to `addr` with state `new`:
    /// an unchanged address keeps a better state (a STALE update of a
    /// REACHABLE entry with the same address changes nothing).
    fn update(&mut self, ip: Ipv4Address, addr: IpoibAddr, new: NeighState, now: u64) -> Learned {
        let Some(n) = self.get_mut(&ip) else {
            return Learned::Nothing;
        };
        let changed = n.addr != Some(addr);
        if !changed && new == NeighState::Stale && n.state != NeighState::Failed {
            return Learned::Nothing;
        }
        let was_waiting = n.addr.is_none();
        n.addr = Some(addr);
        n.state = new;
        n.probes = 0;
        n.updated_us = now;
        n.next_us = now;
        if changed || was_waiting {
            Learned::Resolved(ip)
        } else {
            Learned::Nothing
        }
    }

    /// Reachability confirmed for `ip` at `now` by traffic from the QPN
    /// its address names (an entry with another address is left alone).
    pub fn confirm(&mut self, ip: &Ipv4Address, qpn: u32, now: u64) {
        if let Some(n) = self.get_mut(ip)
            && n.addr.is_some_and(|a| a.qpn() == qpn)
        {
            n.confirmed_us = now;
            if matches!(
                n.state,
                NeighState::Stale | NeighState::Delay | NeighState::Probe
            ) {
                n.state = NeighState::Reachable;
                n.probes = 0;
                n.updated_us = now;
            }
        }
    }

    /// Drops every entry (the link went away or was reset).
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// `neigh_timer_handler` for every entry at `now`: requests to send,
    /// entries aged, failed and collected. `busy` says which entries still
    /// have packets held (never collected).
    pub fn timers(
        &mut self,
        now: u64,
        cfg: &Config,
        busy: &dyn Fn(&Ipv4Address) -> bool,
        act: &mut dyn FnMut(Action),
    ) {
        for n in self.entries.iter_mut() {
            match n.state {
                NeighState::Incomplete if now >= n.next_us => {
                    if n.probes < cfg.arp_mcast_solicit {
                        n.probes += 1;
                        n.next_us = now + cfg.arp_retrans_us;
                        act(Action::Request { ip: n.ip, to: None });
                    } else {
                        n.state = NeighState::Failed;
                        n.addr = None;
                        n.updated_us = now;
                        act(Action::Failed { ip: n.ip });
                    }
                }
                NeighState::Reachable if now.saturating_sub(n.confirmed_us) >= cfg.reachable_us => {
                    n.state = NeighState::Stale;
                    n.updated_us = now;
                }
                NeighState::Delay => {
                    if n.confirmed_us >= n.updated_us {
                        n.state = NeighState::Reachable;
                        n.updated_us = now;
                    } else if now >= n.next_us {
                        n.state = NeighState::Probe;
                        n.probes = 0;
                        n.updated_us = now;
                        n.next_us = now;
                    }
                }
                _ => {}
            }
            if n.state == NeighState::Probe && now >= n.next_us {
                if n.probes < cfg.arp_ucast_solicit {
                    n.probes += 1;
                    n.next_us = now + cfg.arp_retrans_us;
                    act(Action::Request {
                        ip: n.ip,
                        to: n.addr,
                    });
                } else {
                    n.state = NeighState::Failed;
                    n.addr = None;
                    n.updated_us = now;
                    act(Action::Failed { ip: n.ip });
                }
            }
        }
        self.entries.retain(|n| {
            !(matches!(n.state, NeighState::Stale | NeighState::Failed)
                && now.saturating_sub(n.used_us.max(n.updated_us)) >= cfg.gc_stale_us
                && !busy(&n.ip))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::Rng;
    use ib_core::verbs::Gid;

    fn ip(s: [u8; 4]) -> Ipv4Address {
        Ipv4Address::from(s)
    }

    fn addr(n: u8) -> IpoibAddr {
        IpoibAddr::new(
            0x48 + u32::from(n),
            &Gid::new(0xfe80 << 48, 0x0002_c903_0000_0001 + u64::from(n)),
        )
    }

    fn none(_: &Ipv4Address) -> bool {
        false
    }

    #[test]
    fn packets_round_trip() {
        let p = ArpPacket {
            op: ARPOP_REQUEST,
            sha: addr(1),
            sip: ip([10, 0, 0, 1]),
            tha: IpoibAddr::default(),
            tip: ip([10, 0, 0, 2]),
        };
        let mut b = [0u8; 64];
        assert_eq!(p.emit(&mut b), ARP_LEN);
        assert_eq!(&b[..8], &[0, 32, 8, 0, 20, 4, 0, 1]);
        assert_eq!(ArpPacket::parse(&b), Ok(p));
        assert_eq!(ArpPacket::parse(&b[..ARP_LEN]), Ok(p));
        assert_eq!(ArpPacket::parse(&b[..ARP_LEN - 1]), Err(ArpError::Short));
        assert_eq!(p.emit(&mut b[..10]), 0);
        let mut bad = b;
        bad[1] = 1;
        assert_eq!(ArpPacket::parse(&bad), Err(ArpError::HwType(1)));
        let mut bad = b;
        bad[2] = 0x86;
        assert_eq!(ArpPacket::parse(&bad), Err(ArpError::Proto(0x8600)));
        let mut bad = b;
        bad[4] = 6;
        assert_eq!(ArpPacket::parse(&bad), Err(ArpError::Lengths(6, 4)));
        let mut bad = b;
        bad[7] = 3;
        assert_eq!(ArpPacket::parse(&bad), Err(ArpError::Op(3)));
    }

    #[test]
    fn every_truncation_and_bit_flip_and_random_packet_parses_or_is_refused() {
        let p = ArpPacket {
            op: ARPOP_REPLY,
            sha: addr(3),
            sip: ip([192, 168, 100, 3]),
            tha: addr(4),
            tip: ip([192, 168, 100, 4]),
        };
        let mut b = [0u8; ARP_LEN];
        p.emit(&mut b);
        for n in 0..ARP_LEN {
            assert_eq!(ArpPacket::parse(&b[..n]), Err(ArpError::Short));
        }
        for bit in 0..ARP_LEN * 8 {
            let mut f = b;
            f[bit / 8] ^= 1 << (bit % 8);
            match ArpPacket::parse(&f) {
                // A flip in the header is refused; one in an address is a
                // packet with another address.
                Ok(q) => assert!(bit >= 64 && q != p, "bit {bit}"),
                Err(_) => assert!(bit < 64, "bit {bit}"),
            }
        }
        let mut r = Rng(0xa4b);
        let mut ok = 0;
        for i in 0..20_000 {
            let n = (r.next() % 72) as usize;
            let mut f = r.bytes(n);
            if i % 2 == 0 && n >= 8 {
                f[..8].copy_from_slice(&[0, 32, 8, 0, 20, 4, 0, 1 + (i % 4 == 0) as u8]);
            }
            if let Ok(q) = ArpPacket::parse(&f) {
                ok += 1;
                // What parses emits back to the same bytes.
                let mut e = [0u8; ARP_LEN];
                q.emit(&mut e);
                assert_eq!(&e[..], &f[..ARP_LEN]);
            }
        }
        assert!(ok > 100, "{ok}");
    }

    #[test]
    fn a_new_neighbour_is_asked_for_three_times_then_fails_and_is_asked_again_on_use() {
        let cfg = Config::default();
        let mut t = NeighTable::new(4);
        let a = ip([10, 0, 0, 2]);
        assert_eq!(t.output(a, 0, &cfg, &none), Output::Hold);
        assert_eq!(t.output(a, 10, &cfg, &none), Output::Hold);
        let mut acts = Vec::new();
        for now in (0..4_000_000).step_by(100_000) {
            t.timers(now, &cfg, &none, &mut |x| acts.push((now, x)));
        }
        assert_eq!(
            acts,
            [
                (0, Action::Request { ip: a, to: None }),
                (1_000_000, Action::Request { ip: a, to: None }),
                (2_000_000, Action::Request { ip: a, to: None }),
                (3_000_000, Action::Failed { ip: a }),
            ]
        );
        assert_eq!(t.get(&a).unwrap().state, NeighState::Failed);
        // A reply now is too late: the entry stays FAILED until used... and
        // is taken when it comes for a restarted resolution.
        assert_eq!(t.output(a, 5_000_000, &cfg, &none), Output::Hold);
        assert_eq!(t.get(&a).unwrap().state, NeighState::Incomplete);
        assert_eq!(
            t.arp_reply(a, addr(2), 5_100_000),
            Some(Learned::Resolved(a))
        );
        assert_eq!(t.output(a, 5_200_000, &cfg, &none), Output::Send(addr(2)));
        assert_eq!(t.get(&a).unwrap().state, NeighState::Reachable);
    }

    #[test]
    fn unsolicited_replies_create_nothing_and_requests_for_us_create_stale_entries() {
        let cfg = Config::default();
        let mut t = NeighTable::new(4);
        let a = ip([10, 0, 0, 9]);
        assert_eq!(t.arp_reply(a, addr(9), 0), None);
        assert_eq!(t.arp_seen(a, addr(9), 0), Learned::Nothing);
        assert!(t.is_empty());
        assert_eq!(
            t.arp_request_for_us(a, addr(9), 0, &none),
            Learned::Resolved(a)
        );
        assert_eq!(t.get(&a).unwrap().state, NeighState::Stale);
        // The same address again changes nothing.
        assert_eq!(t.arp_request_for_us(a, addr(9), 1, &none), Learned::Nothing);
        // Used: DELAY, then PROBE with unicast requests to what it has, then
        // FAILED without an answer.
        assert_eq!(t.output(a, 10, &cfg, &none), Output::Send(addr(9)));
        assert_eq!(t.get(&a).unwrap().state, NeighState::Delay);
        let mut acts = Vec::new();
        for now in (0..10_000_000).step_by(250_000) {
            t.timers(now + 10, &cfg, &none, &mut |x| acts.push(x));
        }
        assert_eq!(
            acts,
            [
                Action::Request {
                    ip: a,
                    to: Some(addr(9))
                },
                Action::Request {
                    ip: a,
                    to: Some(addr(9))
                },
                Action::Request {
                    ip: a,
                    to: Some(addr(9))
                },
                Action::Failed { ip: a },
            ]
        );
        assert_eq!(t.get(&a).unwrap().addr, None);
    }

    #[test]
    fn confirmation_keeps_a_neighbour_reachable_and_age_makes_it_stale_then_gone() {
        let cfg = Config::default();
        let mut t = NeighTable::new(4);
        let a = ip([10, 0, 0, 2]);
        t.output(a, 0, &cfg, &none);
        t.arp_reply(a, addr(2), 100);
        t.timers(20_000_000, &cfg, &none, &mut |_| {});
        assert_eq!(t.get(&a).unwrap().state, NeighState::Reachable);
        // Traffic from another QPN confirms nothing.
        t.confirm(&a, 0x999, 25_000_000);
        t.timers(31_000_000, &cfg, &none, &mut |_| {});
        assert_eq!(t.get(&a).unwrap().state, NeighState::Stale);
        t.confirm(&a, addr(2).qpn(), 32_000_000);
        assert_eq!(t.get(&a).unwrap().state, NeighState::Reachable);
        // Stale and unused for gc_stale: collected, unless packets wait.
        t.timers(70_000_000, &cfg, &none, &mut |_| {});
        assert_eq!(t.get(&a).unwrap().state, NeighState::Stale);
        t.timers(140_000_000, &cfg, &|_| true, &mut |_| {});
        assert!(t.get(&a).is_some());
        t.timers(140_000_000, &cfg, &none, &mut |_| {});
        assert!(t.get(&a).is_none());
    }

    #[test]
    fn a_full_table_evicts_the_oldest_stale_entry_or_refuses() {
        let cfg = Config::default();
        let mut t = NeighTable::new(2);
        t.arp_request_for_us(ip([10, 0, 0, 2]), addr(2), 5, &none);
        t.arp_request_for_us(ip([10, 0, 0, 3]), addr(3), 1, &none);
        assert_eq!(t.output(ip([10, 0, 0, 4]), 9, &cfg, &none), Output::Hold);
        assert!(t.get(&ip([10, 0, 0, 3])).is_none(), "the oldest went");
        // Two INCOMPLETE... one INCOMPLETE and one STALE held busy: no room.
        assert_eq!(
            t.output(ip([10, 0, 0, 5]), 10, &cfg, &|_| true),
            Output::NoRoom
        );
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn random_arp_sequences_never_panic_and_stay_bounded() {
        let cfg = Config::default();
        let mut t = NeighTable::new(8);
        let mut r = Rng(77);
        let mut now = 0u64;
        for _ in 0..50_000 {
            now += r.next() % 2_000_000;
            let a = ip([10, 0, 0, (r.next() % 16) as u8]);
            let h = addr((r.next() % 4) as u8);
            match r.next() % 6 {
                0 => {
                    t.output(a, now, &cfg, &none);
                }
                1 => {
                    t.arp_reply(a, h, now);
                }
                2 => {
                    t.arp_request_for_us(a, h, now, &none);
                }
                3 => {
                    t.arp_seen(a, h, now);
                }
                4 => t.confirm(&a, h.qpn(), now),
                _ => t.timers(now, &cfg, &none, &mut |_| {}),
            }
            assert!(t.len() <= 8);
            for n in t.iter() {
                let has = n.addr.is_some();
                match n.state {
                    NeighState::Incomplete | NeighState::Failed => assert!(!has, "{n:?}"),
                    _ => assert!(has, "{n:?}"),
                }
            }
        }
    }
}
