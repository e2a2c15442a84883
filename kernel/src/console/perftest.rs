//! perftest and rdma-core's pingpong examples in the shell.
//!
//! perftest in the shell: `ib_write_bw`, `ib_write_lat`, `ib_read_bw`,
//! `ib_read_lat`, `ib_send_bw`, `ib_send_lat`, `ib_atomic_lat`, run by
//! `ib_tools::perftest::run`, and rdma-core's `ibv_rc_pingpong`/`ibv_ud_pingpong`,
//! run by `ib_tools::pingpong::run`, on the chosen HCA (`-d`, default the first
//! registered) with the SA and CM clients registered on first use; Ctrl-C stops any
//! wait. Nothing of perftest's or rdma-core's TCP exchange: the sides meet through
//! the IB CM.

use alloc::string::{String, ToString};
use core::fmt::Write;

use ib_core::ClientId;
use ib_tools::perftest::{self, Params, ParseError, Tool, run::Env};

use crate::console::CmdResult;
use crate::hca::{self, Ib};

/// The SA and CM clients, registered once.
static CLIENTS: spin::Mutex<Option<(ClientId, ClientId)>> = spin::Mutex::new(None);

pub(super) fn clients(ib: &mut Ib) -> (ClientId, ClientId) {
    let mut c = CLIENTS.lock();
    *c.get_or_insert_with(|| {
        (
            ib_core::sa_query::init(&mut ib.core),
            ib_core::cm::init(&mut ib.core),
        )
    })
}

fn tool(name: &'static str, out: &mut dyn Write, args: &[&str]) -> CmdResult {
    let t = Tool::from_name(name).ok_or("unknown tool")?;
    let p = match Params::parse(t, args) {
        Ok(p) => p,
        Err(ParseError::Help) => {
            let _ = writeln!(out, "{}", perftest::usage(t));
            return Ok(());
        }
        Err(e) => return Err(alloc::format!("{e} ({} -h for the options)", name)),
    };
    with_env(p.ib_dev.as_deref(), |env| perftest::run::run(env, &p, out))
}

fn pingpong(t: ib_tools::pingpong::Transport, out: &mut dyn Write, args: &[&str]) -> CmdResult {
    use ib_tools::pingpong;
    let p = match pingpong::Params::parse(t, args) {
        Ok(p) => p,
        Err(e) if e.is_empty() => {
            let _ = writeln!(out, "{}", pingpong::usage(t));
            return Ok(());
        }
        Err(e) => return Err(alloc::format!("{e} ({} -h for the options)", t.name())),
    };
    with_env(p.ib_dev.as_deref(), |env| pingpong::run(env, &p, out))
}

/// The ib_core device and name of the HCA named `name` (`-d`, `-C`;
/// `not_found` words the miss), or of the first registered one.
pub(super) fn pick<'a>(
    hcas: &'a [hca::Hca],
    name: Option<&str>,
    not_found: impl FnOnce(&str) -> String,
) -> Result<(ib_core::DeviceId, &'a str), String> {
    let h = match name {
        Some(n) => hcas
            .iter()
            .find(|h| h.name == n)
            .ok_or_else(|| not_found(n))?,
        None => hcas
            .iter()
            .find(|h| h.id.is_some())
            .ok_or("no registered HCA (see dmesg)")?,
    };
    let dev =
        h.id.ok_or_else(|| alloc::format!("{} is not registered (catastrophic error?)", h.name))?;
    Ok((dev, &h.name))
}

/// Runs `f` with the tools' environment on the HCA named `ib_dev` (`-d`),
/// or on the first registered one: the core, the SA and CM clients, and
/// Ctrl-C read from the console.
fn with_env(ib_dev: Option<&str>, f: impl FnOnce(&mut Env<'_>) -> CmdResult) -> CmdResult {
    hca::with(|ib| {
        let (sa, cm) = clients(ib);
        let Ib { core, hcas, .. } = ib;
        let (dev, name) = pick(hcas, ib_dev, |n| alloc::format!("IB device {n} not found"))?;
        let mut ctrl_c = || crate::console::ctrl_c();
        let mut env = Env {
            core,
            sa,
            cm,
            dev,
            dev_name: name,
            interrupted: &mut ctrl_c,
        };
        f(&mut env)
    })
    .unwrap_or_else(|| {
        Err("no HCA (no ConnectX-3 found, or its bring-up failed: see dmesg)".to_string())
    })
}

/// `ibv_rc_pingpong`.
pub fn ibv_rc_pingpong(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    pingpong(ib_tools::pingpong::Transport::Rc, out, args)
}
/// `ibv_ud_pingpong`.
pub fn ibv_ud_pingpong(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    pingpong(ib_tools::pingpong::Transport::Ud, out, args)
}

/// `ib_write_bw`.
pub fn ib_write_bw(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_write_bw", out, args)
}
/// `ib_write_lat`.
pub fn ib_write_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_write_lat", out, args)
}
/// `ib_read_bw`.
pub fn ib_read_bw(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_read_bw", out, args)
}
/// `ib_read_lat`.
pub fn ib_read_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_read_lat", out, args)
}
/// `ib_send_bw`.
pub fn ib_send_bw(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_send_bw", out, args)
}
/// `ib_send_lat`.
pub fn ib_send_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_send_lat", out, args)
}
/// `ib_atomic_lat`.
pub fn ib_atomic_lat(out: &mut dyn Write, args: &[&str]) -> CmdResult {
    tool("ib_atomic_lat", out, args)
}
