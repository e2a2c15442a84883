//! The local page cache's bookkeeping, without any I/O: which frame holds
//! which page, in which state, dirty or not, and the CLOCK hand that picks
//! a victim when no frame is free (Linux's second-chance reclaim over the
//! accessed bits, as LegoOS's pcache evicts).
//!
//! A frame is free, busy (being filled for the fault in progress, never a
//! victim), mapped (its page table entry present: the hardware keeps the
//! accessed and dirty bits), or cached (holds a page read ahead, not yet
//! mapped: a later fault on it is a hit; its accessed bit is kept here).

use alloc::vec::Vec;

use crate::mmu::Mmu;

/// What a frame holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameState {
    /// Nothing.
    Free,
    /// Being filled for the fault in progress.
    Busy,
    /// A page, mapped.
    Mapped,
    /// A page read ahead, not mapped.
    Cached,
}

/// One frame of the cache.
#[derive(Debug, Clone, Copy)]
pub struct Frame {
    /// The region page it holds (meaningless when free).
    pub page: u64,
    /// Its state.
    pub state: FrameState,
    /// Written since it was last written back, as far as the cache knows
    /// (a mapped frame's page table entry may say more).
    pub dirty: bool,
    /// Referenced, for a cached frame (a mapped one's is in its entry).
    pub young: bool,
}

const NONE: u32 = u32::MAX;

/// Frames, the page-to-frame index and the CLOCK hand.
#[derive(Debug)]
pub struct Cache {
    frames: Vec<Frame>,
    map: Vec<u32>,
    free: Vec<u32>,
    hand: usize,
}

impl Cache {
    /// A cache of `frames` frames (at most `u32::MAX - 1`) for a region of
    /// `pages` pages, every frame free.
    pub fn new(pages: u64, frames: usize) -> Cache {
        Cache {
            frames: alloc::vec![
                Frame {
                    page: 0,
                    state: FrameState::Free,
                    dirty: false,
                    young: false,
                };
                frames
            ],
            map: alloc::vec![NONE; pages as usize],
            free: (0..frames as u32).rev().collect(),
            hand: 0,
        }
    }

    /// Frames in the cache.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether the cache has no frames (never: `Pcache` refuses it).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Pages of the region.
    pub fn pages(&self) -> u64 {
        self.map.len() as u64
    }

    /// The frame holding `page`.
    pub fn lookup(&self, page: u64) -> Option<u32> {
        match self.map.get(page as usize) {
            Some(&f) if f != NONE => Some(f),
            _ => None,
        }
    }

    /// Frame `f`.
    pub fn frame(&self, f: u32) -> &Frame {
        &self.frames[f as usize]
    }

    /// Frame `f`, to change its state or dirty flag.
    pub fn frame_mut(&mut self, f: u32) -> &mut Frame {
        &mut self.frames[f as usize]
    }

    /// Frames in use (not free).
    pub fn used(&self) -> usize {
        self.frames.len() - self.free.len()
    }

    /// A free frame, now busy (holding nothing yet).
    pub fn take_free(&mut self) -> Option<u32> {
        let f = self.free.pop()?;
        self.frames[f as usize].state = FrameState::Busy;
        Some(f)
    }

    /// Puts `page` in busy frame `f` (clean).
    pub fn install(&mut self, f: u32, page: u64) {
        if let Some(slot) = self.map.get_mut(page as usize) {
            *slot = f;
        }
        let fr = &mut self.frames[f as usize];
        fr.page = page;
        fr.state = FrameState::Busy;
        fr.dirty = false;
        fr.young = false;
    }

    /// Takes the page out of frame `f` (which stays busy, for the caller to
    /// reuse, or to [`Cache::release`]).
    pub fn evict(&mut self, f: u32) {
        let fr = &mut self.frames[f as usize];
        if matches!(
            fr.state,
            FrameState::Mapped | FrameState::Cached | FrameState::Busy
        ) && let Some(slot) = self.map.get_mut(fr.page as usize)
            && *slot == f
        {
            *slot = NONE;
        }
        fr.state = FrameState::Busy;
        fr.dirty = false;
        fr.young = false;
    }

    /// Gives busy frame `f` back to the free list (its page, if any,
    /// forgotten).
    pub fn release(&mut self, f: u32) {
        self.evict(f);
        self.frames[f as usize].state = FrameState::Free;
        self.free.push(f);
    }

    /// CLOCK: sweeps from the hand and returns the first mapped or cached
    /// frame whose accessed bit was clear, clearing the bits of those it
    /// passes (a second chance). Busy and free frames are skipped. `None`
    /// only if no frame is mapped or cached. Two turns of the hand at most:
    /// the first clears every bit it sees.
    pub fn choose_victim(&mut self, mmu: &mut dyn Mmu) -> Option<u32> {
        let n = self.frames.len();
        for _ in 0..2 * n + 1 {
            let f = self.hand;
            self.hand = (self.hand + 1) % n;
            let fr = &mut self.frames[f];
            let young = match fr.state {
                FrameState::Mapped => mmu.test_and_clear_young(fr.page),
                FrameState::Cached => core::mem::replace(&mut fr.young, false),
                FrameState::Free | FrameState::Busy => continue,
            };
            if !young {
                return Some(f as u32);
            }
        }
        None
    }

    /// Every frame holding a page, with the page.
    pub fn resident(&self) -> impl Iterator<Item = (u32, &Frame)> {
        self.frames
            .iter()
            .enumerate()
            .filter(|(_, f)| matches!(f.state, FrameState::Mapped | FrameState::Cached))
            .map(|(i, f)| (i as u32, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmu::SoftMmu;
    use hal::BusAddr;

    fn map(c: &mut Cache, m: &mut SoftMmu, page: u64) -> u32 {
        let f = c.take_free().expect("free frame");
        c.install(f, page);
        c.frame_mut(f).state = FrameState::Mapped;
        m.map(page, BusAddr(u64::from(f) * 4096));
        f
    }

    #[test]
    fn clock_gives_referenced_pages_a_second_chance() {
        let mut m = SoftMmu::new(16);
        let mut c = Cache::new(16, 4);
        for p in 0..4 {
            map(&mut c, &mut m, p);
        }
        assert_eq!(c.take_free(), None);
        // Pages 0, 1 and 3 used since mapped; page 2 not.
        for p in [0, 1, 3] {
            m.touch(p, false).unwrap();
        }
        let v = c.choose_victim(&mut m).unwrap();
        assert_eq!(c.frame(v).page, 2, "the one not referenced");
        // The hand cleared 0's and 1's bits on its way and stands at 3:
        // 3 (referenced) and 0 (touched again) get their second chance, 1
        // (not touched since) goes.
        c.evict(v);
        c.install(v, 9);
        c.frame_mut(v).state = FrameState::Mapped;
        m.map(9, BusAddr(u64::from(v) * 4096));
        m.touch(0, false).unwrap();
        let v = c.choose_victim(&mut m).unwrap();
        assert_eq!(c.frame(v).page, 1);
        assert!(!m.test_and_clear_young(3) && !m.test_and_clear_young(0));
    }

    #[test]
    fn all_referenced_still_finds_a_victim_and_busy_frames_are_never_chosen() {
        let mut m = SoftMmu::new(8);
        let mut c = Cache::new(8, 3);
        for p in 0..3 {
            map(&mut c, &mut m, p);
            m.touch(p, true).unwrap();
        }
        let v = c.choose_victim(&mut m).unwrap();
        assert_eq!(
            c.frame(v).page,
            0,
            "a full turn clears everything, then the first"
        );
        // Mark it busy: the next victim is another frame.
        c.evict(v);
        assert_eq!(c.lookup(0), None);
        for _ in 0..5 {
            let w = c.choose_victim(&mut m).unwrap();
            assert_ne!(w, v);
        }
        c.release(v);
        assert_eq!(c.used(), 2);
    }

    #[test]
    fn cached_frames_keep_their_own_young_flag() {
        let mut m = SoftMmu::new(8);
        let mut c = Cache::new(8, 2);
        let a = c.take_free().unwrap();
        c.install(a, 5);
        c.frame_mut(a).state = FrameState::Cached;
        c.frame_mut(a).young = true;
        let b = map(&mut c, &mut m, 6);
        assert_eq!(c.lookup(5), Some(a));
        // The read-ahead page survives one pass; the mapped one, not
        // touched, goes first.
        assert_eq!(c.choose_victim(&mut m), Some(b));
        assert!(!c.frame(a).young);
        assert_eq!(c.resident().count(), 2);
    }

    #[test]
    fn empty_of_pages_has_no_victim() {
        let mut m = SoftMmu::new(4);
        let mut c = Cache::new(4, 2);
        let f = c.take_free().unwrap();
        assert_eq!(c.choose_victim(&mut m), None, "busy frames are no victims");
        c.release(f);
        assert_eq!(c.used(), 0);
    }
}
