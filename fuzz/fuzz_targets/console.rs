//! The console's input side, as far as it runs on the host: bytes typed on the serial line through `line_edit` (escape sequences, editing keys, history, typeahead), each finished line split into `;`-separated commands and words as the kernel's shell does, and the words handed to the argument parsers that live in host crates: `ip` (run on a stack), `ping`, the `ip=` boot option, perftest's and the pingpong tools' options, `saquery`, the diags' port and peer arguments.
//!
//! The kernel's own command table (kernel/src/console) only builds for the
//! kernel target; its parsers are small and call these.

#![no_main]

use libfuzzer_sys::fuzz_target;
use line_edit::{Done, LineEditor, Typeahead};
use net::wire::{self};
use net::{LinkKind, Loopback, Stack};

fn run(stack: &mut Stack, words: &[&str]) {
    let Some((&name, args)) = words.split_first() else {
        return;
    };
    let mut out = String::new();
    match name {
        "ip" => {
            let _ = net::iproute::ip(stack, Some(&mut ()), args, &mut out);
        }
        "ping" => {
            let _ = net::ping::parse(args);
        }
        "ip=" => {
            for a in args {
                let _ = net::config::parse(a);
                let _ = net::config::parse_cidr(a);
            }
        }
        "saquery" => {
            let _ = ib_tools::diags::saquery::parse(args);
        }
        "ibv_rc_pingpong" => {
            let _ = ib_tools::pingpong::Params::parse(ib_tools::pingpong::Transport::Rc, args);
        }
        "ibv_ud_pingpong" => {
            let _ = ib_tools::pingpong::Params::parse(ib_tools::pingpong::Transport::Ud, args);
        }
        "smpquery" | "perfquery" | "ibroute" => {
            for a in args {
                let _ = ib_tools::diags::PortId::parse(a, false);
                let _ = ib_tools::diags::PortId::parse(a, true);
                let _ = ib_tools::perftest::Peer::parse(a);
            }
        }
        _ => {
            if let Some(tool) = ib_tools::perftest::Tool::from_name(name) {
                let _ = ib_tools::perftest::Params::parse(tool, args);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut stack = Stack::new(0);
    let _ = stack.add_link("lo", Box::new(Loopback::new()));
    let (a, _b, _w) = wire::pair(LinkKind::Infiniband, 2044);
    let _ = stack.add_link("ib0", Box::new(a));
    let mut ed = LineEditor::new();
    let mut ahead = Typeahead::new();
    let mut echoed = 0usize;
    // The first byte says how many of the bytes arrive while a command
    // runs (kept as typeahead) rather than at the prompt.
    let (split, data) = match data.split_first() {
        Some((s, d)) => (usize::from(*s), d),
        None => (0, data),
    };
    for (i, &b) in data.iter().enumerate() {
        if i % 7 < split % 8 && ahead.take(b) {
            continue;
        }
        while let Some(k) = ahead.pop() {
            let _ = ed.feed(k, &mut |s| echoed += s.len());
        }
        if let Some(Done::Run(line)) = ed.feed(b, &mut |s| echoed += s.len()) {
            for cmd in line.split(';').map(str::trim).filter(|c| !c.is_empty()) {
                let words: Vec<&str> = cmd.split_whitespace().collect();
                run(&mut stack, &words);
            }
            stack.poll(i as u64 * 1000, &mut ());
        }
        assert!(ed.line().len() <= line_edit::MAX_LINE);
    }
    let _ = ed.history();
});
