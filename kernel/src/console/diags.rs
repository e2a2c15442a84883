//! infiniband-diags in the shell: `perfquery`, `smpquery`, `sminfo`, `saquery`, run by `ib_tools::diags` through ib_core's QP0/QP1 (and, for `saquery`, its SA client, registered on first use) on the chosen HCA and port (`-C CA`, `-P PORT` as infiniband-diags; default the first registered HCA, port 1); `ibnetdiscover` and `ibping` are not here yet.

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write;

use ib_tools::diags::{self, Src};

use crate::console::CmdResult;
use crate::hca::{self, Ib};

type Tool = fn(&mut ib_core::IbCore, Src, &[&str], &mut dyn Write) -> Result<(), String>;

/// Takes `-C CA` and `-P PORT` out of `args`, runs `tool` from there.
fn run(out: &mut dyn Write, args: &[&str], tool: Tool) -> CmdResult {
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
        tool(core, Src { dev, port }, &rest, out)
    })
    .unwrap_or_else(|| {
        Err("no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)".to_string())
    })
}

/// `perfquery [-x] [-C CA] [-P PORT] [LID [PORT]]`.
pub fn perfquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, diags::perfquery)
}

/// `smpquery [-D] [-C CA] [-P PORT] OP [DEST [PORT]]`.
pub fn smpquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, diags::smpquery)
}

/// `sminfo [-C CA] [-P PORT] [SM_LID]`.
pub fn sminfo(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, diags::sminfo)
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
