//! iproute2's `ip` for the stack: `ip addr`, `ip link`, `ip neigh` and `ip route`, with the words, abbreviations and output lines of iproute2 6.1 (`ip/ipaddress.c`, `ip/iplink.c`, `ip/ipneigh.c`, `ip/iproute.c`).
//!
//! `ip link add link LOWER name NAME type vlan id VID` makes a VLAN device
//! (the only kind of link made here) and `ip link delete NAME` takes one
//! out; `-d` shows a VLAN device's id.
//!
//! Leaves out: JSON and brief output, `ip link set` (links are always
//! administratively up, MTUs are the driver's), address lifetimes and
//! labels, `brd` (no address here carries one), neighbour and route
//! changes beyond `ip route add|del`, tables other than `main` and `local`,
//! and the queue figures (`qdisc` is always `noqueue`, there is no `qlen`).
//! Errors read as iproute2's do after the command's name (`ip: RTNETLINK
//! answers: File exists`).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write;

use smoltcp::wire::{Ipv4Address, Ipv4Cidr};

use crate::config::parse_cidr;
use crate::link::{LinkKind, LinkStats};
use crate::route::{Dst, Proto, Table};
use crate::{LinkId, Stack};

/// iproute2's `matches`: `word` is a prefix of `full`.
fn matches(word: &str, full: &str) -> bool {
    !word.is_empty() && full.starts_with(word)
}

/// Runs `ip ARGS`; `ctx` is what the stack's links are polled with (a
/// VLAN device made by `ip link add` registers its VID through it;
/// without one, `ip link add` and `delete` are refused).
pub fn ip<C: ?Sized>(
    stack: &mut Stack<C>,
    ctx: Option<&mut C>,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    let mut stats = 0;
    let mut details = false;
    let mut rest = args;
    while let [opt, more @ ..] = rest {
        if !opt.starts_with('-') {
            break;
        }
        let o = opt.trim_start_matches('-');
        if matches(o, "statistics") || o == "s" {
            stats += 1;
        } else if matches(o, "details") || o == "d" {
            details = true;
        } else if o == "4" {
        } else if matches(o, "help") {
            return Err(USAGE.to_string());
        } else {
            return Err(format!("Option \"{opt}\" is unknown, try \"ip -help\"."));
        }
        rest = more;
    }
    let Some((obj, rest)) = rest.split_first() else {
        return Err(USAGE.to_string());
    };
    if matches(obj, "address") {
        addr(stack, rest, stats, out)
    } else if matches(obj, "route") {
        route(stack, rest, out)
    } else if matches(obj, "neighbor") || matches(obj, "neighbour") {
        neigh(stack, rest, out)
    } else if matches(obj, "link") {
        link(stack, ctx, rest, stats, details, out)
    } else if matches(obj, "help") {
        Err(USAGE.to_string())
    } else {
        Err(format!("Object \"{obj}\" is unknown, try \"ip help\"."))
    }
}

/// What `ip help` says.
pub const USAGE: &str = "Usage: ip [ -s ] [ -d ] { addr | link | neigh | route } ...\n\
    ip addr [show [dev] IFNAME]   ip addr { add | del } ADDR/LEN dev IFNAME\n\
    ip link [show [dev] IFNAME]   ip neigh [show [dev IFNAME]]\n\
    ip link add link IFNAME name NAME type vlan id VID   ip link delete NAME\n\
    ip route [show [table main|local|all]]   ip route get ADDR\n\
    ip route { add | del } { default | PREFIX } [via GATEWAY] [dev IFNAME]";

/// `show [dev] IFNAME`: the link asked for, or all.
fn show_dev<C: ?Sized>(
    stack: &Stack<C>,
    args: &[&str],
    cmd: &str,
) -> Result<Option<LinkId>, String> {
    match args {
        [] => Ok(None),
        ["dev", name] | [name] => stack.dev(name).map(Some).map_err(|e| e.to_string()),
        _ => Err(format!(
            "Command line is not complete. Try \"ip {cmd} help\"."
        )),
    }
}

fn is_show(w: &str) -> bool {
    matches(w, "show") || matches(w, "list") || w == "lst"
}

/// The `<...>` flags and the state word of a link.
fn flags_state(kind: LinkKind, carrier: bool) -> (String, &'static str) {
    let mut f: Vec<&str> = Vec::new();
    if !carrier && kind != LinkKind::Loopback {
        f.push("NO-CARRIER");
    }
    match kind {
        LinkKind::Loopback => f.push("LOOPBACK"),
        LinkKind::Ether | LinkKind::Infiniband => f.extend(["BROADCAST", "MULTICAST"]),
        LinkKind::None => f.extend(["POINTOPOINT", "MULTICAST", "NOARP"]),
    }
    f.push("UP");
    if carrier {
        f.push("LOWER_UP");
    }
    let state = match (kind, carrier) {
        (LinkKind::Loopback | LinkKind::None, _) => "UNKNOWN",
        (_, true) => "UP",
        (_, false) => "DOWN",
    };
    (f.join(","), state)
}

/// The first two lines of a link, as `ip link` (`mode` true) and `ip addr`
/// print them.
fn link_head<C: ?Sized>(stack: &Stack<C>, id: LinkId, mode: bool, out: &mut dyn Write) {
    let Some(i) = stack.iface(id) else {
        return;
    };
    let (flags, state) = flags_state(i.kind, i.carrier);
    let lower = i
        .link
        .vlan()
        .map(|(_, l)| format!("@{l}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{}: {}{lower}: <{flags}> mtu {} qdisc noqueue state {state} {}group default",
        id.0,
        i.name,
        i.mtu,
        if mode { "mode DEFAULT " } else { "" }
    );
    let hw = i.link.hw_addr();
    if hw.is_empty() {
        let _ = writeln!(out, "    link/{} ", i.kind.name());
    } else {
        let _ = writeln!(
            out,
            "    link/{} {hw} brd {}",
            i.kind.name(),
            i.link.broadcast()
        );
    }
}

/// iproute2's statistics block (`print_link_stats64`): columns as wide
/// as their widest figure, each figure followed by a space.
pub fn print_stats(s: &LinkStats, out: &mut dyn Write) {
    let mut cols = [10usize, 7, 6, 7, 7, 7, 10];
    let rx = [
        s.rx_bytes,
        s.rx_packets,
        s.rx_errors,
        s.rx_dropped,
        s.rx_missed,
        s.multicast,
    ];
    let tx = [
        s.tx_bytes,
        s.tx_packets,
        s.tx_errors,
        s.tx_dropped,
        s.tx_carrier_errors,
        s.collisions,
    ];
    for v in rx.iter().chain(tx.iter()).enumerate() {
        let (i, v) = (v.0 % 6, *v.1);
        cols[i] = cols[i].max(v.to_string().len());
    }
    let head = |out: &mut dyn Write, dir: &str, words: [&str; 6]| {
        let _ = writeln!(
            out,
            "    {dir}: {:>w0$} {:>w1$} {:>w2$} {:>w3$} {:>w4$} {:>w5$} {:>w6$}",
            words[0],
            words[1],
            words[2],
            words[3],
            words[4],
            words[5],
            "",
            w0 = cols[0] - 4,
            w1 = cols[1],
            w2 = cols[2],
            w3 = cols[3],
            w4 = cols[4],
            w5 = cols[5],
            w6 = cols[6],
        );
    };
    let nums = |out: &mut dyn Write, v: [u64; 6]| {
        let _ = out.write_str("    ");
        for (i, n) in v.iter().enumerate() {
            let _ = write!(out, "{n:>w$} ", w = cols[i]);
        }
        let _ = writeln!(out);
    };
    head(
        out,
        "RX",
        ["bytes", "packets", "errors", "dropped", "missed", "mcast"],
    );
    nums(out, rx);
    head(
        out,
        "TX",
        [
            "bytes", "packets", "errors", "dropped", "carrier", "collsns",
        ],
    );
    nums(out, tx);
}

fn link<C: ?Sized>(
    stack: &mut Stack<C>,
    ctx: Option<&mut C>,
    args: &[&str],
    stats: u32,
    details: bool,
    out: &mut dyn Write,
) -> Result<(), String> {
    let args = match args.split_first() {
        Some((w, rest)) if is_show(w) => rest,
        Some((w, rest)) if matches(w, "add") || matches(w, "delete") => {
            let Some(ctx) = ctx else {
                return Err("RTNETLINK answers: No such device (no adapter)".to_string());
            };
            if matches(w, "add") {
                return link_add(stack, ctx, rest);
            }
            let name = match rest {
                [d, n] if *d == "dev" => n,
                [n] => n,
                _ => {
                    return Err("Not enough information: \"dev\" argument is required.".to_string());
                }
            };
            let id = stack.dev(name).map_err(|e| e.to_string())?;
            return stack.delete_link(id, ctx).map_err(|e| e.to_string());
        }
        Some((w, _)) if matches(w, "set") => {
            return Err("RTNETLINK answers: Operation not supported".to_string());
        }
        _ => args,
    };
    let only = show_dev(stack, args, "link")?;
    let ids: Vec<LinkId> = stack.links().map(|(id, _)| id).collect();
    for id in ids.into_iter().filter(|id| only.is_none_or(|o| o == *id)) {
        link_head(stack, id, true, out);
        if details && let Some((vid, _)) = stack.link(id).and_then(|l| l.vlan()) {
            let _ = writeln!(out, "    vlan protocol 802.1Q id {vid} <REORDER_HDR> ");
        }
        if stats > 0
            && let Some(s) = stack.stats(id)
        {
            print_stats(&s, out);
        }
    }
    Ok(())
}

/// `ip link add [link LOWER] [name] NAME type vlan [protocol 802.1Q] id
/// VID` (iproute2's `iplink_modify` and `iplink_vlan.c`, in any order).
fn link_add<C: ?Sized>(stack: &mut Stack<C>, ctx: &mut C, args: &[&str]) -> Result<(), String> {
    let (mut lower, mut name, mut kind, mut id) = (None, None, None, None);
    let mut rest = args;
    while let [w, more @ ..] = rest {
        let value = |what: &str| -> Result<&str, String> {
            more.first().copied().ok_or_else(|| {
                format!("Command line is not complete. Try option \"help\" (after {what})")
            })
        };
        match *w {
            "link" => lower = Some(value("link")?),
            "name" | "dev" => name = Some(value("name")?),
            "type" => kind = Some(value("type")?),
            "id" if kind == Some("vlan") => {
                let v = value("id")?;
                id =
                    Some(v.parse::<u16>().ok().ok_or_else(|| {
                        format!("Error: argument \"{v}\" is wrong: id is invalid")
                    })?);
            }
            "protocol" if kind == Some("vlan") => {
                let p = value("protocol")?;
                if !p.eq_ignore_ascii_case("802.1q") {
                    return Err(format!(
                        "Error: argument \"{p}\" is wrong: protocol is invalid (802.1Q only here)"
                    ));
                }
            }
            n if name.is_none() => {
                name = Some(n);
                rest = more;
                continue;
            }
            other => {
                return Err(format!(
                    "Error: argument \"{other}\" is wrong: unknown here"
                ));
            }
        }
        rest = &more[1..];
    }
    let name = name.ok_or("Not enough information: \"dev\" argument is required.")?;
    match kind {
        Some("vlan") => {}
        Some(k) => {
            return Err(format!(
                "Error: Unknown device type \"{k}\" (vlan only here)."
            ));
        }
        None => return Err("Not enough information: \"type\" argument is required.".to_string()),
    }
    let vid = id.ok_or("Error: 8021q: VLAN id is required.")?;
    let lower = lower.ok_or("Error: 8021q: the lower device (\"link\") is required.")?;
    let lower = stack.dev(lower).map_err(|e| e.to_string())?;
    stack
        .add_vlan(lower, name, vid, ctx)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn addr<C: ?Sized>(
    stack: &mut Stack<C>,
    args: &[&str],
    stats: u32,
    out: &mut dyn Write,
) -> Result<(), String> {
    match args.split_first() {
        None => show_addrs(stack, None, stats, out),
        Some((w, rest)) if is_show(w) => {
            let only = show_dev(stack, rest, "address")?;
            show_addrs(stack, only, stats, out)
        }
        Some((w, rest)) if matches(w, "add") => {
            let (dev, a) = addr_args(stack, rest)?;
            stack.add_addr(dev, a).map_err(|e| e.to_string())
        }
        Some((w, rest)) if matches(w, "delete") => {
            let (dev, a) = addr_args(stack, rest)?;
            stack.del_addr(dev, a).map_err(|e| e.to_string())
        }
        Some((w, _)) => Err(format!(
            "Command \"{w}\" is unknown, try \"ip address help\"."
        )),
    }
}

/// `ADDR/LEN dev IFNAME` (either order, `local ADDR` too).
fn addr_args<C: ?Sized>(stack: &Stack<C>, args: &[&str]) -> Result<(LinkId, Ipv4Cidr), String> {
    let (mut dev, mut a) = (None, None);
    let mut it = args.iter();
    while let Some(&w) = it.next() {
        match w {
            "dev" => dev = it.next().copied(),
            "local" => a = it.next().copied(),
            w if a.is_none() => a = Some(w),
            w => {
                return Err(format!(
                    "Error: either \"local\" is duplicate, or \"{w}\" is a garbage."
                ));
            }
        }
    }
    let dev = dev.ok_or("Not enough information: \"dev\" argument is required.")?;
    let a = a.ok_or("Not enough information: address is required.")?;
    let a = parse_cidr(a)
        .map_err(|_| format!("Error: inet prefix is expected rather than \"{a}\"."))?;
    Ok((stack.dev(dev).map_err(|e| e.to_string())?, a))
}

fn show_addrs<C: ?Sized>(
    stack: &Stack<C>,
    only: Option<LinkId>,
    stats: u32,
    out: &mut dyn Write,
) -> Result<(), String> {
    let ids: Vec<LinkId> = stack.links().map(|(id, _)| id).collect();
    for id in ids.into_iter().filter(|id| only.is_none_or(|o| o == *id)) {
        link_head(stack, id, false, out);
        if stats > 0
            && let Some(s) = stack.stats(id)
        {
            print_stats(&s, out);
        }
        let Some(i) = stack.iface(id) else {
            continue;
        };
        for (n, c) in i.addrs.iter().enumerate() {
            let scope = if c.address().is_loopback() {
                "host"
            } else {
                "global"
            };
            let secondary = i.addrs[..n].iter().any(|p| p.network() == c.network());
            let _ = writeln!(
                out,
                "    inet {c} scope {scope} {}{}",
                if secondary { "secondary " } else { "" },
                i.name
            );
            let _ = writeln!(out, "       valid_lft forever preferred_lft forever");
        }
    }
    Ok(())
}

fn neigh<C: ?Sized>(
    stack: &mut Stack<C>,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    let args = match args.split_first() {
        Some((w, rest)) if is_show(w) => rest,
        Some((w, _)) if !matches(w, "dev") => {
            return Err(format!(
                "Command \"{w}\" is unknown, try \"ip neigh help\"."
            ));
        }
        _ => args,
    };
    let only = match args {
        [] => None,
        ["dev", name] => Some(stack.dev(name).map_err(|e| e.to_string())?),
        _ => return Err("Command line is not complete. Try \"ip neigh help\".".to_string()),
    };
    let links: Vec<(LinkId, String)> = stack
        .links()
        .filter(|(id, _)| only.is_none_or(|o| o == *id))
        .map(|(id, n)| (id, n.to_string()))
        .collect();
    for (id, name) in links {
        stack.neighbours(id, &mut |n| {
            let _ = write!(out, "{} dev {name} ", n.addr);
            if let Some(ll) = n.lladdr {
                let _ = write!(out, "lladdr {ll} ");
            }
            let _ = writeln!(out, "{}", n.state.name());
        });
    }
    Ok(())
}

fn route<C: ?Sized>(
    stack: &mut Stack<C>,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    match args.split_first() {
        None => show_routes(stack, &[Table::Main], out),
        Some((w, rest)) if is_show(w) => match rest {
            [] | ["table", "main"] => show_routes(stack, &[Table::Main], out),
            ["table", "local"] => show_routes(stack, &[Table::Local], out),
            ["table", "all"] => show_routes(stack, &[Table::Main, Table::Local], out),
            _ => Err("Command line is not complete. Try \"ip route help\".".to_string()),
        },
        Some((w, rest)) if matches(w, "get") => {
            let [a] = rest else {
                return Err("need at least a destination address".to_string());
            };
            let dst: Ipv4Address = a
                .parse()
                .map_err(|_| format!("Error: inet prefix is expected rather than \"{a}\"."))?;
            let e = stack
                .route_get(dst)
                .map_err(|e| format!("RTNETLINK answers: {e}"))?;
            let name = |id| stack.link_name(id).unwrap_or("?").to_string();
            if e.local {
                let _ = writeln!(out, "local {dst} dev {} src {} uid 0", name(e.link), e.src);
                let _ = writeln!(out, "    cache <local> ");
            } else {
                let _ = write!(out, "{dst} ");
                if e.next_hop != dst {
                    let _ = write!(out, "via {} ", e.next_hop);
                }
                let _ = writeln!(out, "dev {} src {} uid 0", name(e.dev), e.src);
                let _ = writeln!(out, "    cache ");
            }
            Ok(())
        }
        Some((w, rest)) if matches(w, "add") || matches(w, "delete") => {
            let add = matches(w, "add");
            let (dst, via, dev) = route_args(stack, rest)?;
            let r = if add {
                stack.add_route(dst, via, dev, Proto::Static)
            } else {
                stack.del_route(dst, via, dev)
            };
            r.map_err(|e| e.to_string())
        }
        Some((w, _)) => Err(format!(
            "Command \"{w}\" is unknown, try \"ip route help\"."
        )),
    }
}

/// `[to] default|PREFIX [via GW] [dev IF]`.
#[allow(clippy::type_complexity)]
fn route_args<C: ?Sized>(
    stack: &Stack<C>,
    args: &[&str],
) -> Result<(Ipv4Cidr, Option<Ipv4Address>, Option<LinkId>), String> {
    let (mut dst, mut via, mut dev) = (None, None, None);
    let mut it = args.iter();
    while let Some(&w) = it.next() {
        match w {
            "via" => {
                let g = it.next().ok_or("Command line is not complete.")?;
                via = Some(g.parse::<Ipv4Address>().map_err(|_| {
                    format!("Error: inet address is expected rather than \"{g}\".")
                })?);
            }
            "dev" => {
                let d = it.next().ok_or("Command line is not complete.")?;
                dev = Some(stack.dev(d).map_err(|e| e.to_string())?);
            }
            "to" => {
                let d = it.next().ok_or("Command line is not complete.")?;
                dst = Some(*d);
            }
            w if dst.is_none() => dst = Some(w),
            w => {
                return Err(format!(
                    "Error: either \"to\" is duplicate, or \"{w}\" is a garbage."
                ));
            }
        }
    }
    let dst = match dst {
        None => return Err("Error: destination is required (default or PREFIX).".to_string()),
        Some("default" | "0/0" | "all") => Ipv4Cidr::new(Ipv4Address::UNSPECIFIED, 0),
        Some(d) => parse_cidr(d)
            .map_err(|_| format!("Error: inet prefix is expected rather than \"{d}\"."))?,
    };
    Ok((dst, via, dev))
}

fn show_routes<C: ?Sized>(
    stack: &Stack<C>,
    tables: &[Table],
    out: &mut dyn Write,
) -> Result<(), String> {
    let mut rs: Vec<_> = stack
        .routes()
        .filter(|r| tables.contains(&r.table))
        .copied()
        .collect();
    rs.sort_by_key(|r| (r.table == Table::Local, r.dst.address(), r.dst.prefix_len()));
    for r in rs {
        let name = stack.link_name(r.dev).unwrap_or("?");
        let mut line = String::new();
        if r.table == Table::Local {
            line.push_str("local ");
        }
        let _ = write!(line, "{} ", Dst(r.dst));
        if let Some(g) = r.via {
            let _ = write!(line, "via {g} ");
        }
        let _ = write!(line, "dev {name} ");
        match r.proto {
            Proto::Kernel => line.push_str("proto kernel "),
            Proto::Boot => line.push_str("proto boot "),
            Proto::Static => {}
        }
        if r.via.is_none() || r.table == Table::Local {
            let _ = write!(line, "scope {} ", r.scope());
        }
        if let Some(s) = r.src {
            let _ = write!(line, "src {s} ");
        }
        if r.table == Table::Main && !stack.carrier(r.dev) {
            line.push_str("linkdown ");
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    Ok(())
}
