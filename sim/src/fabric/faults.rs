//! Per-packet faults on the wire.
//!
//! Drop (always, at a seeded random rate, every Nth, a number of times, or only
//! packets matching a QPN, an opcode or a sending port), corrupt (one byte flipped
//! after the sender computed the CRCs, so the receiver sees a bad VCRC/ICRC, or on
//! an Ethernet cable a bad FCS, drops the packet and counts it), delay (the link holds the packet, and the
//! ones behind it, for a while), and cable pulls at a given time with an optional
//! reinsertion; plus the parser for cx3-emu's `--drop`, `--corrupt`, `--delay`,
//! `--pull` and `--fault-seed` options. Bit-level errors in the link layer (symbol
//! errors, link retraining) are not modelled.
//!
//! Where faults apply: a rule without a port applies to every packet sent
//! onto a cable whose far end is an HCA port (so a corrupted packet
//! reaches the receiving HCA's CRC check, even through a switch, whose
//! ingress would otherwise drop it first); a rule with a port applies to
//! packets sent out of that port, whatever is at the far end.

use super::PortId;

/// A small deterministic RNG (SplitMix64): the same seed gives the same
/// faults from run to run.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// From a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p && p > 0.0
    }
}

/// What a rule does to a packet it selects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FaultKind {
    /// The packet is lost.
    Drop,
    /// One byte after the LRH is flipped.
    Corrupt,
    /// The packet arrives this many nanoseconds later.
    Delay(u64),
}

/// Which of the matching packets a rule selects.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Trigger {
    /// Every one.
    Always,
    /// Each with this probability (seeded RNG).
    Rate(f64),
    /// The Nth, 2Nth, ... (N >= 1).
    EveryNth(u64),
}

/// Which packets a rule looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Match {
    /// BTH destination QP.
    pub qpn: Option<u32>,
    /// BTH opcode.
    pub opcode: Option<u8>,
    /// Sent out of this fabric port (and then whatever the far end is).
    pub port: Option<PortId>,
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    /// What to do.
    pub kind: FaultKind,
    /// Which matching packets.
    pub trigger: Trigger,
    /// Which packets match.
    pub matcher: Match,
    /// Stop after selecting this many packets.
    pub times: Option<u64>,
    /// Only while the fabric's clock is within `[from, until)` ns (a burst
    /// at a set time; `None`: always).
    pub during: Option<(u64, u64)>,
    /// Matching packets seen.
    pub seen: u64,
    /// Packets selected.
    pub hits: u64,
}

impl FaultRule {
    /// A rule of `kind` hitting every packet.
    pub fn new(kind: FaultKind) -> FaultRule {
        FaultRule {
            kind,
            trigger: Trigger::Always,
            matcher: Match::default(),
            times: None,
            during: None,
            seen: 0,
            hits: 0,
        }
    }
    /// Select each matching packet with probability `p`.
    pub fn rate(mut self, p: f64) -> FaultRule {
        self.trigger = Trigger::Rate(p);
        self
    }
    /// Select every `n`th matching packet.
    pub fn every(mut self, n: u64) -> FaultRule {
        self.trigger = Trigger::EveryNth(n.max(1));
        self
    }
    /// Only packets to this destination QP.
    pub fn qpn(mut self, q: u32) -> FaultRule {
        self.matcher.qpn = Some(q);
        self
    }
    /// Only packets with this BTH opcode.
    pub fn opcode(mut self, o: u8) -> FaultRule {
        self.matcher.opcode = Some(o);
        self
    }
    /// Only packets sent out of this port.
    pub fn port(mut self, p: PortId) -> FaultRule {
        self.matcher.port = Some(p);
        self
    }
    /// At most `n` packets.
    pub fn times(mut self, n: u64) -> FaultRule {
        self.times = Some(n);
        self
    }
    /// Only packets sent while the clock is in `[from_ns, until_ns)`.
    pub fn during(mut self, from_ns: u64, until_ns: u64) -> FaultRule {
        self.during = Some((from_ns, until_ns));
        self
    }
}

/// What the faults did to one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verdict {
    /// Lost.
    pub drop: bool,
    /// A byte was flipped (at this offset).
    pub corrupt_at: Option<usize>,
    /// Extra delay in nanoseconds.
    pub delay_ns: u64,
}

/// Counts of what the faults did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FaultStats {
    /// Packets dropped.
    pub dropped: u64,
    /// Packets corrupted.
    pub corrupted: u64,
    /// Packets delayed.
    pub delayed: u64,
}

/// The fault rules of a fabric.
#[derive(Debug, Clone)]
pub struct PacketFaults {
    /// The rules, applied in order (a drop ends the list).
    pub rules: Vec<FaultRule>,
    rng: Rng,
    /// What they did.
    pub stats: FaultStats,
}

impl Default for PacketFaults {
    fn default() -> Self {
        PacketFaults::new(0x1b_5eed)
    }
}

impl PacketFaults {
    /// No rules, RNG seeded with `seed`.
    pub fn new(seed: u64) -> PacketFaults {
        PacketFaults {
            rules: Vec::new(),
            rng: Rng::new(seed),
            stats: FaultStats::default(),
        }
    }
    /// Reseeds the RNG.
    pub fn seed(&mut self, seed: u64) {
        self.rng = Rng::new(seed);
    }
    /// Adds a rule.
    pub fn add(&mut self, r: FaultRule) {
        self.rules.push(r);
    }
    /// Removes every rule.
    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// Applies the rules to a packet (an Ethernet frame if `eth`) sent out
    /// of `from` towards an HCA (`to_hca`) at `now_ns`, corrupting `bytes`
    /// in place if a rule says so.
    pub(crate) fn apply(
        &mut self,
        now_ns: u64,
        from: PortId,
        to_hca: bool,
        eth: bool,
        bytes: &mut [u8],
    ) -> Verdict {
        let mut v = Verdict::default();
        if self.rules.is_empty() {
            return v;
        }
        let (opcode, qpn) = if eth {
            roce_bth_fields(bytes)
        } else {
            bth_fields(bytes)
        };
        for r in &mut self.rules {
            let m = &r.matcher;
            let here = match m.port {
                Some(p) => p == from,
                None => to_hca,
            };
            if !here
                || m.qpn.is_some_and(|q| Some(q) != qpn)
                || m.opcode.is_some_and(|o| Some(o) != opcode)
                || r.times.is_some_and(|t| r.hits >= t)
                || r.during.is_some_and(|(a, b)| now_ns < a || now_ns >= b)
            {
                continue;
            }
            r.seen += 1;
            let hit = match r.trigger {
                Trigger::Always => true,
                Trigger::Rate(p) => self.rng.chance(p),
                Trigger::EveryNth(n) => r.seen.is_multiple_of(n.max(1)),
            };
            if !hit {
                continue;
            }
            r.hits += 1;
            match r.kind {
                FaultKind::Drop => {
                    v.drop = true;
                    self.stats.dropped += 1;
                    return v;
                }
                FaultKind::Corrupt => {
                    // Anything after the LRH (the Ethernet header) and
                    // before the VCRC (the FCS): the packet still routes,
                    // and its CRCs fail.
                    let (lo, hi) = if eth {
                        (
                            crate::fabric::packet::ETH_HLEN,
                            bytes.len().saturating_sub(crate::fabric::packet::FCS_LEN),
                        )
                    } else {
                        (
                            crate::fabric::packet::LRH_LEN,
                            bytes.len().saturating_sub(crate::fabric::packet::VCRC_LEN),
                        )
                    };
                    if hi > lo {
                        let at = lo + self.rng.below((hi - lo) as u64) as usize;
                        bytes[at] ^= 1 << self.rng.below(8);
                        v.corrupt_at = Some(at);
                        self.stats.corrupted += 1;
                    }
                }
                FaultKind::Delay(ns) => {
                    v.delay_ns = v.delay_ns.saturating_add(ns);
                    self.stats.delayed += 1;
                }
            }
        }
        v
    }
}

/// BTH opcode and destination QP, if the bytes have a BTH where the LRH
/// says.
fn bth_fields(b: &[u8]) -> (Option<u8>, Option<u32>) {
    let Some(&b1) = b.get(1) else {
        return (None, None);
    };
    let off = match b1 & 3 {
        2 => 8,
        3 => 48,
        _ => return (None, None),
    };
    match b.get(off..off + 12) {
        Some(h) => (Some(h[0]), Some(u32::from_be_bytes([0, h[5], h[6], h[7]]))),
        None => (None, None),
    }
}

/// BTH opcode and destination QP of a RoCE v1 frame (BTH after the
/// Ethernet header and the GRH); none for any other frame.
fn roce_bth_fields(b: &[u8]) -> (Option<u8>, Option<u32>) {
    use crate::fabric::packet::{ETHERTYPE_ROCE, EthHdr, GRH_LEN};
    let Ok(h) = EthHdr::parse(b) else {
        return (None, None);
    };
    if h.ethertype != ETHERTYPE_ROCE {
        return (None, None);
    }
    let off = h.len() + GRH_LEN;
    match b.get(off..off + 12) {
        Some(x) => (Some(x[0]), Some(u32::from_be_bytes([0, x[5], x[6], x[7]]))),
        None => (None, None),
    }
}

/// A port named on the command line: `NODE/PORT`, NODE a node name from
/// the topology (e.g. `H1`, `Sw1`, or `node0` for the first HCA).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortRef {
    /// Node name.
    pub node: String,
    /// Port number.
    pub port: u8,
}

impl PortRef {
    /// Parses `NODE/PORT`.
    pub fn parse(s: &str) -> Result<PortRef, String> {
        let (node, port) = s
            .rsplit_once('/')
            .ok_or_else(|| format!("`{s}`: expected NODE/PORT, e.g. node0/1 or sw0/3"))?;
        let port = parse_u64(port)
            .ok()
            .and_then(|p| u8::try_from(p).ok())
            .ok_or_else(|| format!("`{s}`: port `{port}` is not a number 0-255"))?;
        if node.is_empty() {
            return Err(format!("`{s}`: empty node name"));
        }
        Ok(PortRef {
            node: node.into(),
            port,
        })
    }
}

/// A rule as given on the command line, before its port is resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct FaultSpec {
    /// The rule (its `matcher.port` is filled in from `port`).
    pub rule: FaultRule,
    /// The sending port, by name.
    pub port: Option<PortRef>,
}

/// When a scheduled cable pull happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullAt {
    /// At this fabric time, in nanoseconds.
    Time(u64),
    /// Once this many bytes (whole packets, either direction) have crossed
    /// the cable: tied to the traffic, not to how fast a machine runs it.
    Bytes(u64),
}

/// A scheduled cable pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSpec {
    /// The port whose cable is pulled.
    pub port: PortRef,
    /// When.
    pub at: PullAt,
    /// Reinserted this long after (None: stays out).
    pub reinsert_after_ns: Option<u64>,
}

/// The packet-fault options of cx3-emu.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FaultOptions {
    /// Fault rules.
    pub rules: Vec<FaultSpec>,
    /// Cable pulls.
    pub pulls: Vec<PullSpec>,
    /// RNG seed.
    pub seed: Option<u64>,
}

impl FaultOptions {
    /// The option names this parser takes (each takes one value).
    pub const FLAGS: [&'static str; 5] =
        ["--drop", "--corrupt", "--delay", "--pull", "--fault-seed"];

    /// Takes one option: `--drop SPEC`, `--corrupt SPEC`, `--delay
    /// TIME[,SPEC]`, `--pull NODE/PORT@TIME[+TIME]`, `--fault-seed N`.
    /// SPEC is comma-separated `rate=P`, `every=N`, `times=N`, `qpn=N`,
    /// `opcode=N`, `from=TIME`, `until=TIME`, `port=NODE/PORT` (or `all`); TIME is a number with a
    /// unit `ns`, `us`, `ms` or `s`. Returns `Ok(false)` for an option
    /// that is not one of these.
    pub fn parse_arg(&mut self, flag: &str, value: &str) -> Result<bool, String> {
        match flag {
            "--drop" => self.rules.push(parse_spec(FaultKind::Drop, value)?),
            "--corrupt" => self.rules.push(parse_spec(FaultKind::Corrupt, value)?),
            "--delay" => {
                let (t, rest) = value.split_once(',').unwrap_or((value, ""));
                let ns = parse_time(t).map_err(|e| format!("--delay {value}: {e}"))?;
                self.rules.push(parse_spec(FaultKind::Delay(ns), rest)?);
            }
            "--pull" => self.pulls.push(parse_pull(value)?),
            "--fault-seed" => {
                self.seed =
                    Some(parse_u64(value).map_err(|e| format!("--fault-seed {value}: {e}"))?)
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let r = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else {
        s.parse()
    };
    r.map_err(|_| format!("`{s}` is not a number"))
}

/// Parses `10us`, `5ms`, `2s`, `100ns` (a bare number is nanoseconds).
pub fn parse_time(s: &str) -> Result<u64, String> {
    const UNITS: &[(&str, u64)] = &[
        ("", 1),
        ("ns", 1),
        ("us", 1_000),
        ("ms", 1_000_000),
        ("s", 1_000_000_000),
    ];
    parse_with_unit(
        s,
        UNITS,
        "a time (e.g. 10us, 5ms)",
        "time unit",
        "ns, us, ms, s",
    )
}

/// A number followed by one of `units` (name, multiplier).
fn parse_with_unit(
    s: &str,
    units: &[(&str, u64)],
    what: &str,
    unit_kind: &str,
    names: &str,
) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("`{s}` is not {what}"))?;
    let mul = units
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, m)| *m)
        .ok_or_else(|| format!("`{s}`: unknown {unit_kind} `{unit}` ({names})"))?;
    n.checked_mul(mul)
        .ok_or_else(|| format!("`{s}` is too large"))
}

fn parse_spec(kind: FaultKind, s: &str) -> Result<FaultSpec, String> {
    let mut rule = FaultRule::new(kind);
    let mut port = None;
    let what = match kind {
        FaultKind::Drop => "--drop",
        FaultKind::Corrupt => "--corrupt",
        FaultKind::Delay(_) => "--delay",
    };
    let (mut from, mut until) = (None, None);
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        if item == "all" {
            continue;
        }
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("{what} {s}: `{item}` is not KEY=VALUE"))?;
        let bad = |e: String| format!("{what} {s}: {e}");
        match k {
            "rate" => {
                let p: f64 = v
                    .parse()
                    .map_err(|_| bad(format!("rate `{v}` is not a number")))?;
                if !(0.0..=1.0).contains(&p) {
                    return Err(bad(format!("rate {p} is not within 0..1")));
                }
                rule = rule.rate(p);
            }
            "every" => {
                let n = parse_u64(v).map_err(bad)?;
                if n == 0 {
                    return Err(bad("every=0: N must be at least 1".into()));
                }
                rule = rule.every(n);
            }
            "times" => rule = rule.times(parse_u64(v).map_err(bad)?),
            "qpn" => {
                let q = parse_u64(v).map_err(bad)?;
                if q > 0xff_ffff {
                    return Err(bad(format!("QPN {q:#x} has more than 24 bits")));
                }
                rule = rule.qpn(q as u32);
            }
            "opcode" => {
                let o = parse_u64(v).map_err(bad)?;
                let o = u8::try_from(o).map_err(|_| bad(format!("opcode {o:#x} above 0xff")))?;
                rule = rule.opcode(o);
            }
            "port" => port = Some(PortRef::parse(v).map_err(bad)?),
            "from" => from = Some(parse_time(v).map_err(bad)?),
            "until" => until = Some(parse_time(v).map_err(bad)?),
            _ => {
                return Err(bad(format!(
                    "unknown key `{k}` (rate, every, times, qpn, opcode, port, from, until)"
                )));
            }
        }
    }
    if from.is_some() || until.is_some() {
        let (a, b) = (from.unwrap_or(0), until.unwrap_or(u64::MAX));
        if b <= a {
            return Err(format!("{what} {s}: until= must be later than from="));
        }
        rule = rule.during(a, b);
    }
    Ok(FaultSpec { rule, port })
}

/// A byte count with its unit: `B`, `KiB`, `MiB` or `GiB`.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    const UNITS: &[(&str, u64)] = &[
        ("B", 1),
        ("KiB", 1 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
    ];
    parse_with_unit(
        s,
        UNITS,
        "a byte count (e.g. 64MiB)",
        "size unit",
        "B, KiB, MiB, GiB",
    )
}

fn parse_pull(s: &str) -> Result<PullSpec, String> {
    let (p, t) = s.split_once('@').ok_or_else(|| {
        format!(
            "--pull {s}: expected NODE/PORT@WHEN[+TIME] (WHEN a time or a byte count), e.g. node1/1@100ms+50ms or node1/1@64MiB"
        )
    })?;
    let port = PortRef::parse(p).map_err(|e| format!("--pull {s}: {e}"))?;
    let (at, back) = match t.split_once('+') {
        Some((a, b)) => (a, Some(b)),
        None => (t, None),
    };
    let at = if at.ends_with('B') {
        PullAt::Bytes(parse_bytes(at).map_err(|e| format!("--pull {s}: {e}"))?)
    } else {
        PullAt::Time(parse_time(at).map_err(|e| format!("--pull {s}: {e}"))?)
    };
    let reinsert_after_ns = back
        .map(parse_time)
        .transpose()
        .map_err(|e| format!("--pull {s}: {e}"))?;
    Ok(PullSpec {
        port,
        at,
        reinsert_after_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse_clearly() {
        let mut o = FaultOptions::default();
        assert_eq!(o.parse_arg("--drop", "rate=0.5,qpn=0x48"), Ok(true));
        assert_eq!(o.parse_arg("--corrupt", "every=3,port=node0/1"), Ok(true));
        assert_eq!(o.parse_arg("--delay", "10us,opcode=0x64,times=2"), Ok(true));
        assert_eq!(o.parse_arg("--pull", "sw0/3@100ms+50ms"), Ok(true));
        assert_eq!(o.parse_arg("--fault-seed", "42"), Ok(true));
        assert_eq!(o.parse_arg("--nodes", "2"), Ok(false));
        assert_eq!(o.rules[0].rule.trigger, Trigger::Rate(0.5));
        assert_eq!(o.rules[0].rule.matcher.qpn, Some(0x48));
        assert_eq!(
            o.rules[1].port,
            Some(PortRef {
                node: "node0".into(),
                port: 1
            })
        );
        assert_eq!(o.rules[2].rule.kind, FaultKind::Delay(10_000));
        assert_eq!(o.rules[2].rule.times, Some(2));
        assert_eq!(
            o.pulls[0],
            PullSpec {
                port: PortRef {
                    node: "sw0".into(),
                    port: 3
                },
                at: PullAt::Time(100_000_000),
                reinsert_after_ns: Some(50_000_000)
            }
        );
        assert_eq!(o.parse_arg("--pull", "node1/1@64MiB"), Ok(true));
        assert_eq!(o.pulls[1].at, PullAt::Bytes(64 << 20));
        for (f, v) in [
            ("--drop", "rate=2"),
            ("--drop", "every=0"),
            ("--drop", "bogus=1"),
            ("--drop", "qpn"),
            ("--drop", "qpn=0x1000000"),
            ("--delay", "10 parsecs"),
            ("--pull", "sw0/3"),
            ("--pull", "sw0@1ms"),
            ("--pull", "sw0/x@1ms"),
            ("--pull", "sw0/1@64MB"),
            ("--pull", "sw0/1@B"),
            ("--fault-seed", "many"),
        ] {
            let e = o.parse_arg(f, v).unwrap_err();
            assert!(e.contains(v) || e.contains(f), "{f} {v}: {e}");
        }
    }

    #[test]
    fn every_nth_rate_and_match() {
        let mut f = PacketFaults::new(1);
        f.add(FaultRule::new(FaultKind::Drop).every(3));
        let mut b = vec![0u8; 30];
        b[1] = 2;
        let drops: Vec<bool> = (0..6)
            .map(|_| f.apply(0, PortId(0), true, false, &mut b).drop)
            .collect();
        assert_eq!(drops, [false, false, true, false, false, true]);
        assert!(
            !f.apply(0, PortId(0), false, false, &mut b).drop,
            "not towards an HCA"
        );
        f.clear();
        f.add(FaultRule::new(FaultKind::Drop).qpn(5));
        assert!(!f.apply(0, PortId(0), true, false, &mut b).drop);
        b[8 + 7] = 5;
        assert!(f.apply(0, PortId(0), true, false, &mut b).drop);
        f.clear();
        f.add(FaultRule::new(FaultKind::Drop).rate(0.25));
        let n = (0..4000)
            .filter(|_| f.apply(0, PortId(0), true, false, &mut b).drop)
            .count();
        assert!((800..1200).contains(&n), "about a quarter: {n}");
    }

    #[test]
    fn a_burst_drops_only_within_its_window() {
        let mut o = FaultOptions::default();
        assert_eq!(o.parse_arg("--drop", "from=2s,until=3s"), Ok(true));
        let mut f = PacketFaults::new(1);
        f.add(o.rules[0].rule.clone());
        let mut b = vec![0u8; 30];
        b[1] = 2;
        let s = 1_000_000_000;
        let at = |f: &mut PacketFaults, t: u64, b: &mut Vec<u8>| {
            f.apply(t, PortId(0), true, false, b).drop
        };
        assert!(!at(&mut f, 2 * s - 1, &mut b), "before the window");
        assert!(at(&mut f, 2 * s, &mut b), "at its start");
        assert!(at(&mut f, 3 * s - 1, &mut b), "inside");
        assert!(!at(&mut f, 3 * s, &mut b), "at its end");
        assert_eq!(f.stats.dropped, 2);
        assert!(o.parse_arg("--drop", "from=3s,until=2s").is_err());
        assert!(o.parse_arg("--drop", "until=0s").is_err());
    }
}
