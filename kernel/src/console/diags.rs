//! infiniband-diags in the shell: `perfquery`, `smpquery`, `sminfo`, `saquery`, `ibnetdiscover` and `ibping`, run by `ib_tools` through ib_core's QP0/QP1 (and, for `saquery` and `ibping -G`, an SA client, registered on first use) on the chosen HCA and port (`-C CA`, `-P PORT` as infiniband-diags; default the first registered HCA, port 1); the ibping responder is not a command (the kernel runs it from boot, see `hca`).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write;

use ib_tools::diags::{self, Src};

use crate::console::CmdResult;
use crate::hca::{self, Ib};

type Tool = fn(&mut ib_core::IbCore, Src, &[&str], &mut dyn Write) -> Result<(), String>;

/// A tool that waits longer than one query: it gets the SA client and the
/// Ctrl-C check too.
type LongTool = fn(
    &mut ib_core::IbCore,
    Option<ib_core::ClientId>,
    Src,
    &[&str],
    &mut dyn FnMut() -> bool,
    &mut dyn Write,
) -> Result<(), String>;

/// Takes `-C CA` and `-P PORT` out of `args`, runs `tool` from there.
fn run(out: &mut dyn Write, args: &[&str], tool: Tool) -> CmdResult {
    run_long(out, args, None, Some(tool))
}

fn run_long(
    out: &mut dyn Write,
    args: &[&str],
    long: Option<LongTool>,
    tool: Option<Tool>,
) -> CmdResult {
    let mut ca: Option<&str> = None;
    let mut port: u8 = 1;
    let mut rest: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(&a) = it.next() {
        match a {
            "-C" | "--Ca" => ca = Some(it.next().ok_or("-C needs a CA name")?),
            "-P" | "--Port" => {
                let p = it.next().ok_or("-P needs a port number")?;
                port = p
                    .parse()
                    .ok()
                    .filter(|p| (1..=2).contains(p))
                    .ok_or_else(|| alloc::format!("bad port '{p}' (1 or 2)"))?;
            }
            _ => rest.push(a),
        }
    }
    hca::with(|ib| {
        let sa = long.map(|_| super::perftest::clients(ib).0);
        let Ib { core, hcas } = ib;
        let h = match ca {
            Some(n) => hcas
                .iter()
                .find(|h| h.name == n)
                .ok_or_else(|| alloc::format!("CA '{n}' not found"))?,
            None => hcas
                .iter()
                .find(|h| h.id.is_some())
                .ok_or("no registered HCA (see dmesg)")?,
        };
        let dev = h
            .id
            .ok_or_else(|| alloc::format!("{} is not registered (catastrophic error?)", h.name))?;
        let src = Src { dev, port };
        match (long, tool) {
            (Some(t), _) => {
                let mut ctrl_c = || crate::serial::try_read() == Some(0x03);
                t(core, sa, src, &rest, &mut ctrl_c, out)
            }
            (None, Some(t)) => t(core, src, &rest, out),
            (None, None) => Ok(()),
        }
    })
    .unwrap_or_else(|| {
        Err("no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)".to_string())
    })
}

/// `perfquery [-x] [-G] [-C CA] [-P PORT] [LID|GUID [PORT]]`.
pub fn perfquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    fn t(
        core: &mut ib_core::IbCore,
        sa: Option<ib_core::ClientId>,
        src: Src,
        args: &[&str],
        _stop: &mut dyn FnMut() -> bool,
        out: &mut dyn Write,
    ) -> Result<(), String> {
        diags::perfquery_sa(core, sa, src, args, out)
    }
    run_long(out, args, Some(t), None)
}

/// `smpquery [-D|-G] [-C CA] [-P PORT] OP [DEST [PORT]]`.
pub fn smpquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    fn t(
        core: &mut ib_core::IbCore,
        sa: Option<ib_core::ClientId>,
        src: Src,
        args: &[&str],
        _stop: &mut dyn FnMut() -> bool,
        out: &mut dyn Write,
    ) -> Result<(), String> {
        diags::smpquery_sa(core, sa, src, args, out)
    }
    run_long(out, args, Some(t), None)
}

/// `sminfo [-C CA] [-P PORT] [SM_LID]`.
pub fn sminfo(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, diags::sminfo)
}

/// `ibnetdiscover [-s] [-C CA] [-P PORT]`.
pub fn ibnetdiscover(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    fn t(
        core: &mut ib_core::IbCore,
        _sa: Option<ib_core::ClientId>,
        src: Src,
        args: &[&str],
        stop: &mut dyn FnMut() -> bool,
        out: &mut dyn Write,
    ) -> Result<(), String> {
        ib_tools::ibnetdiscover::ibnetdiscover(core, src, args, stop, out)
    }
    run_long(out, args, Some(t), None)
}

/// `ibping [-c COUNT] [-G] [-C CA] [-P PORT] DEST`.
pub fn ibping(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run_long(out, args, Some(ib_tools::ibping::ibping), None)
}

/// The SA client `saquery` asks through, registered on first use.
static SA: spin::Mutex<Option<ib_core::ClientId>> = spin::Mutex::new(None);

fn saquery_tool(
    core: &mut ib_core::IbCore,
    src: Src,
    args: &[&str],
    out: &mut dyn Write,
) -> Result<(), String> {
    // Arguments first: a usage error needs no port.
    diags::saquery::parse(args)?;
    let sa = *SA
        .lock()
        .get_or_insert_with(|| ib_core::sa_query::ib_sa_init(core));
    let mut ctrl_c = || crate::serial::try_read() == Some(0x03);
    diags::saquery::wait_port_active(core, src, &mut ctrl_c, out)?;
    diags::saquery::saquery(core, sa, src, args, out)
}

/// `saquery [-C CA] [-P PORT] [-N] [LID|NODE_DESC]`, `saquery -p [LID]`.
pub fn saquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, saquery_tool)
}
