//! infiniband-diags in the shell.
//!
//! `perfquery`, `smpquery`, `sminfo`, `saquery`, `ibnetdiscover` and `ibping`, run
//! by `ib_tools` through ib_core's QP0/QP1 (and, for `saquery` and `ibping -G`, an
//! SA client, registered on first use) on the chosen HCA and port (`-C CA`, `-P
//! PORT` as infiniband-diags; default the first registered HCA, port 1); the ibping
//! responder is not a command (the kernel runs it from boot, see `hca`).

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt::Write;

use ib_tools::diags::{self, Src};

use crate::console::CmdResult;
use crate::hca::{self, Ib};

/// Takes `-C CA` and `-P PORT` out of `args`, runs `tool` there with the
/// rest, the SA client (with `sa`: the tools' shared one, registered on
/// first use) and the Ctrl-C check.
fn run(
    out: &mut dyn Write,
    args: &[&str],
    sa: bool,
    tool: impl FnOnce(
        &mut ib_core::IbCore,
        Option<ib_core::ClientId>,
        Src,
        &[&str],
        &mut dyn FnMut() -> bool,
        &mut dyn Write,
    ) -> Result<(), String>,
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
        let sa = sa.then(|| super::perftest::clients(ib).0);
        let Ib { core, hcas } = ib;
        let (dev, _) = super::perftest::pick(hcas, ca, |n| alloc::format!("CA '{n}' not found"))?;
        let src = Src { dev, port };
        let mut ctrl_c = || crate::console::ctrl_c();
        tool(core, sa, src, &rest, &mut ctrl_c, out)
    })
    .unwrap_or_else(|| {
        Err("no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)".to_string())
    })
}

/// `perfquery [-x] [-a] [-G] [-C CA] [-P PORT] [LID|GUID [PORT]]` (PORT 255
/// or `-a`: all ports added up).
pub fn perfquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, true, |core, sa, src, args, _, out| {
        diags::perfquery_sa(core, sa, src, args, out)
    })
}

/// `smpquery [-D|-G] [-C CA] [-P PORT] OP [DEST [PORT]]`.
pub fn smpquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, true, |core, sa, src, args, _, out| {
        diags::smpquery_sa(core, sa, src, args, out)
    })
}

/// `sminfo [-C CA] [-P PORT] [SM_LID]`.
pub fn sminfo(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, false, |core, _, src, args, _, out| {
        diags::sminfo(core, src, args, out)
    })
}

/// `ibnetdiscover [-s] [-C CA] [-P PORT]`.
pub fn ibnetdiscover(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, true, |core, _, src, args, stop, out| {
        ib_tools::ibnetdiscover::ibnetdiscover(core, src, args, stop, out)
    })
}

/// `ibping [-c COUNT] [-G] [-C CA] [-P PORT] DEST`.
pub fn ibping(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, true, ib_tools::ibping::ibping)
}

/// The SA client `saquery` asks through, registered on first use.
static SA: spin::Mutex<Option<ib_core::ClientId>> = spin::Mutex::new(None);

/// `saquery [-C CA] [-P PORT] [-N] [LID|NODE_DESC]`, `saquery -p [LID]`,
/// `saquery -g`.
pub fn saquery(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    run(out, args, false, |core, _, src, args, ctrl_c, out| {
        // Arguments first: a usage error needs no port.
        diags::saquery::parse(args)?;
        let sa = *SA
            .lock()
            .get_or_insert_with(|| ib_core::sa_query::init(core));
        diags::saquery::wait_port_active(core, src, ctrl_c, out)?;
        diags::saquery::saquery(core, sa, src, args, out)
    })
}
