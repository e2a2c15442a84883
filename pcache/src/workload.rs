//! The built-in workloads of the paging experiments, each over an array of
//! 64-bit words ([`Words`]: local memory, or a remote-backed region) and
//! each ending in a checksum, so that a page lost or stale on the way shows
//! as a checksum unlike the same run's on local memory: a sequential scan,
//! GUPS-style random read-modify-writes, a sort of 64-bit keys, and a hash
//! table under a skewed (Zipf) lookup mix.
//!
//! Everything is deterministic from the seed. Each checks [`Words::failed`]
//! every [`CHECK_EVERY`] accesses and ends with [`Aborted`] when the memory
//! behind it is gone.

use alloc::vec::Vec;
use core::fmt;

/// Accesses between two looks at [`Words::failed`].
pub const CHECK_EVERY: usize = 4096;

/// Memory a workload runs on: `len()` 64-bit words.
pub trait Words {
    /// Words.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Word `i` (below `len()`).
    fn get(&mut self, i: usize) -> u64;
    /// Sets word `i`.
    fn set(&mut self, i: usize, v: u64);
    /// Whether the memory failed (a page that could not be fetched): the
    /// workload then ends with [`Aborted`].
    fn failed(&self) -> bool {
        false
    }
}

impl Words for [u64] {
    fn len(&self) -> usize {
        <[u64]>::len(self)
    }
    fn get(&mut self, i: usize) -> u64 {
        self[i]
    }
    fn set(&mut self, i: usize, v: u64) {
        self[i] = v;
    }
}

/// The memory failed under the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted;

impl fmt::Display for Aborted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the workload's memory failed")
    }
}

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A sequential scan: fill, read, read-modify-write, read.
    Seq,
    /// GUPS: random read-modify-writes of single words, then a scan.
    Gups,
    /// A sort of the words as keys (quicksort in place, heapsort below a
    /// depth limit), then a check that they are in order.
    Sort,
    /// A hash table (open addressing, half full) bulk-loaded, then looked
    /// up with Zipf-distributed keys (s = 1, scrambled), 1 in 20 an update.
    Kv,
}

impl Kind {
    /// Every workload, in the experiment's order.
    pub const ALL: [Kind; 4] = [Kind::Seq, Kind::Gups, Kind::Sort, Kind::Kv];

    /// Its name on the console and in the CSV.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Seq => "seq",
            Kind::Gups => "gups",
            Kind::Sort => "sort",
            Kind::Kv => "kv",
        }
    }

    /// The workload named `s`.
    pub fn from_name(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Operations by default for `words` words (GUPS updates, KV lookups;
    /// the others ignore it).
    pub fn default_ops(self, words: usize) -> u64 {
        match self {
            Kind::Gups => (words / 64).max(1) as u64,
            Kind::Kv => (words / 32).max(1) as u64,
            Kind::Seq | Kind::Sort => 0,
        }
    }
}

/// What a workload produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The checksum of its result.
    pub checksum: u64,
    /// Its own check (the sort: the keys are in order; KV: every key
    /// found); the others always pass.
    pub ok: bool,
}

/// xorshift64*: the workloads' random numbers.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded (0 is replaced).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number below `n` (`n` > 0), by the multiply-high method.
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// A 64-bit mix (splitmix64's finaliser).
pub fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn fold(s: u64, v: u64) -> u64 {
    (s.rotate_left(5) ^ v).wrapping_mul(0x100_0000_01b3)
}

/// Counts accesses and looks at [`Words::failed`] every [`CHECK_EVERY`].
struct Guard(usize);

impl Guard {
    fn tick<W: Words + ?Sized>(&mut self, w: &W) -> Result<(), Aborted> {
        self.0 += 1;
        if self.0 >= CHECK_EVERY {
            self.0 = 0;
            if w.failed() {
                return Err(Aborted);
            }
        }
        Ok(())
    }
}

/// Runs workload `kind` on `w` with `seed` and `ops` operations (GUPS
/// updates, KV lookups; 0: [`Kind::default_ops`]).
pub fn run<W: Words + ?Sized>(
    kind: Kind,
    w: &mut W,
    seed: u64,
    ops: u64,
) -> Result<Outcome, Aborted> {
    let ops = if ops == 0 {
        kind.default_ops(w.len())
    } else {
        ops
    };
    let r = match kind {
        Kind::Seq => seq(w, seed),
        Kind::Gups => gups(w, seed, ops),
        Kind::Sort => sort(w, seed),
        Kind::Kv => kv(w, seed, ops),
    }?;
    // A failure after the last look still fails the run.
    if w.failed() {
        return Err(Aborted);
    }
    Ok(r)
}

fn checksum<W: Words + ?Sized>(w: &mut W, g: &mut Guard) -> Result<u64, Aborted> {
    let mut s = 0;
    for i in 0..w.len() {
        s = fold(s, w.get(i));
        g.tick(w)?;
    }
    Ok(s)
}

fn seq<W: Words + ?Sized>(w: &mut W, seed: u64) -> Result<Outcome, Aborted> {
    let n = w.len();
    let mut g = Guard(0);
    for i in 0..n {
        w.set(i, mix(seed ^ i as u64));
        g.tick(w)?;
    }
    let mut s = seed;
    for pass in 0..2 {
        for i in 0..n {
            let v = w.get(i);
            s = fold(s, v);
            if pass == 1 {
                w.set(i, v ^ s);
            }
            g.tick(w)?;
        }
    }
    let c = checksum(w, &mut g)?;
    Ok(Outcome {
        checksum: fold(s, c),
        ok: true,
    })
}

fn gups<W: Words + ?Sized>(w: &mut W, seed: u64, ops: u64) -> Result<Outcome, Aborted> {
    let n = w.len();
    let mut g = Guard(0);
    for i in 0..n {
        w.set(i, i as u64);
        g.tick(w)?;
    }
    let mut rng = Rng::new(seed);
    for _ in 0..ops {
        let r = rng.next_u64();
        let i = ((u128::from(r) * n as u128) >> 64) as usize;
        let v = w.get(i);
        w.set(i, v ^ r);
        g.tick(w)?;
    }
    Ok(Outcome {
        checksum: checksum(w, &mut g)?,
        ok: true,
    })
}

fn sort<W: Words + ?Sized>(w: &mut W, seed: u64) -> Result<Outcome, Aborted> {
    let n = w.len();
    let mut g = Guard(0);
    let mut rng = Rng::new(seed);
    for i in 0..n {
        w.set(i, rng.next_u64());
        g.tick(w)?;
    }
    let depth = 2 * (usize::BITS - n.leading_zeros()) as usize;
    quicksort(w, 0, n, depth, &mut g)?;
    let mut ok = true;
    let mut s = 0;
    let mut prev = 0;
    for i in 0..n {
        let v = w.get(i);
        ok &= i == 0 || prev <= v;
        prev = v;
        s = fold(s, v);
        g.tick(w)?;
    }
    Ok(Outcome { checksum: s, ok })
}

fn swap<W: Words + ?Sized>(w: &mut W, a: usize, b: usize) {
    let (x, y) = (w.get(a), w.get(b));
    w.set(a, y);
    w.set(b, x);
}

/// Sorts `w[lo..hi]`: Hoare partitions around a median of three,
/// recursing into the smaller side (depth at most log2 n), insertion sort
/// below 16 keys, heapsort past `depth` levels.
fn quicksort<W: Words + ?Sized>(
    w: &mut W,
    mut lo: usize,
    mut hi: usize,
    mut depth: usize,
    g: &mut Guard,
) -> Result<(), Aborted> {
    while hi - lo > 16 {
        if depth == 0 {
            return heapsort(w, lo, hi, g);
        }
        depth -= 1;
        let mid = lo + (hi - lo) / 2;
        let (a, b, c) = (w.get(lo), w.get(mid), w.get(hi - 1));
        let pivot = a.max(b).min(a.min(b).max(c));
        let (mut i, mut j) = (lo, hi - 1);
        loop {
            while w.get(i) < pivot {
                i += 1;
                g.tick(w)?;
            }
            while w.get(j) > pivot {
                j -= 1;
                g.tick(w)?;
            }
            if i >= j {
                break;
            }
            swap(w, i, j);
            i += 1;
            j -= 1;
            g.tick(w)?;
        }
        // [lo, j] <= pivot <= [j + 1, hi)
        let split = j + 1;
        if split - lo < hi - split {
            quicksort(w, lo, split, depth, g)?;
            lo = split;
        } else {
            quicksort(w, split, hi, depth, g)?;
            hi = split;
        }
    }
    for i in lo + 1..hi {
        let v = w.get(i);
        let mut j = i;
        while j > lo && w.get(j - 1) > v {
            let u = w.get(j - 1);
            w.set(j, u);
            j -= 1;
            g.tick(w)?;
        }
        w.set(j, v);
    }
    Ok(())
}

fn heapsort<W: Words + ?Sized>(
    w: &mut W,
    lo: usize,
    hi: usize,
    g: &mut Guard,
) -> Result<(), Aborted> {
    let n = hi - lo;
    let sift = |w: &mut W, mut root: usize, end: usize, g: &mut Guard| -> Result<(), Aborted> {
        loop {
            let mut child = 2 * root + 1;
            if child >= end {
                return Ok(());
            }
            if child + 1 < end && w.get(lo + child) < w.get(lo + child + 1) {
                child += 1;
            }
            if w.get(lo + root) >= w.get(lo + child) {
                return Ok(());
            }
            swap(w, lo + root, lo + child);
            root = child;
            g.tick(w)?;
        }
    };
    for start in (0..n / 2).rev() {
        sift(w, start, n, g)?;
    }
    for end in (1..n).rev() {
        swap(w, lo, lo + end);
        sift(w, 0, end, g)?;
    }
    Ok(())
}

/// Zipf sampling with s = 1 over ranks `0..n` (rank r weighs 1/(r+1)),
/// from a cumulative table in fixed point (local memory, not the region);
/// integer arithmetic only.
#[derive(Debug, Clone)]
pub struct Zipf {
    cdf: Vec<u64>,
}

impl Zipf {
    /// The table for `n` ranks (`n` > 0).
    pub fn new(n: usize) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0u64;
        for r in 0..n as u64 {
            acc += (1u64 << 40) / (r + 1);
            cdf.push(acc);
        }
        Zipf { cdf }
    }

    /// A rank.
    pub fn sample(&self, rng: &mut Rng) -> usize {
        let total = self.cdf.last().copied().unwrap_or(0);
        if total == 0 {
            return 0;
        }
        let u = rng.below(total);
        self.cdf.partition_point(|&c| c <= u)
    }
}

/// The key of entry `i` of the table (never 0: 0 marks an empty slot).
fn kv_key(seed: u64, i: u64) -> u64 {
    mix(seed ^ mix(i)) | 1
}

fn kv<W: Words + ?Sized>(w: &mut W, seed: u64, ops: u64) -> Result<Outcome, Aborted> {
    let slots = w.len() / 2;
    let mut g = Guard(0);
    for i in 0..2 * slots {
        w.set(i, 0);
        g.tick(w)?;
    }
    let keys = slots / 2;
    if keys == 0 {
        return Ok(Outcome {
            checksum: 0,
            ok: true,
        });
    }
    let home = |k: u64| ((u128::from(mix(k)) * slots as u128) >> 64) as usize;
    // A bulk load: keys inserted in the order of their home slots (sorted
    // in local memory), so the table fills front to back.
    let mut order: Vec<(usize, u64)> = (0..keys as u64)
        .map(|i| (home(kv_key(seed, i)), i))
        .collect();
    order.sort_unstable();
    for (h, i) in order {
        let k = kv_key(seed, i);
        let mut s = h;
        while w.get(2 * s) != 0 {
            s = (s + 1) % slots;
            g.tick(w)?;
        }
        w.set(2 * s, k);
        w.set(2 * s + 1, mix(k ^ 0x5555));
        g.tick(w)?;
    }
    let zipf = Zipf::new(keys);
    let mut rng = Rng::new(seed ^ 0xabcd);
    let mut sum = 0;
    let mut ok = true;
    // Rank r is entry (r * P) mod keys: hot keys spread over the table.
    const P: u128 = 2_147_483_647;
    for op in 0..ops {
        let r = zipf.sample(&mut rng);
        let i = ((r as u128 * P) % keys as u128) as u64;
        let k = kv_key(seed, i);
        let mut s = home(k);
        let mut probes = 0;
        loop {
            let found = w.get(2 * s);
            if found == k {
                break;
            }
            probes += 1;
            if found == 0 || probes > slots {
                ok = false;
                break;
            }
            s = (s + 1) % slots;
            g.tick(w)?;
        }
        let v = w.get(2 * s + 1);
        if op % 20 == 0 {
            w.set(2 * s + 1, v.wrapping_add(1));
        }
        sum = fold(sum, v);
        g.tick(w)?;
    }
    Ok(Outcome { checksum: sum, ok })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(kind: Kind, words: usize, seed: u64) -> Outcome {
        let mut v = alloc::vec![0u64; words];
        run(kind, v.as_mut_slice(), seed, 0).unwrap()
    }

    #[test]
    fn every_workload_is_deterministic_and_checks_itself() {
        for k in Kind::ALL {
            let a = local(k, 4096, 7);
            assert!(a.ok, "{k:?}");
            assert_eq!(a, local(k, 4096, 7), "{k:?}");
            assert_ne!(
                a.checksum,
                local(k, 4096, 8).checksum,
                "{k:?}: the seed matters"
            );
            assert_eq!(Kind::from_name(k.name()), Some(k));
        }
    }

    #[test]
    fn sort_sorts_and_a_changed_word_changes_the_checksum() {
        let mut v = alloc::vec![0u64; 10_000];
        let a = run(Kind::Sort, v.as_mut_slice(), 3, 0).unwrap();
        assert!(a.ok && v.windows(2).all(|p| p[0] <= p[1]));
        // Heapsort path too (depth 0).
        let mut h: Vec<u64> = (0..1000u64).map(mix).collect();
        heapsort(h.as_mut_slice(), 0, 1000, &mut Guard(0)).unwrap();
        assert!(h.windows(2).all(|p| p[0] <= p[1]));
        let mut q: Vec<u64> = (0..1000u64).map(|i| mix(i) % 7).collect();
        quicksort(q.as_mut_slice(), 0, 1000, 0, &mut Guard(0)).unwrap();
        assert!(q.windows(2).all(|p| p[0] <= p[1]), "duplicates, heapsort");
    }

    /// Memory that "fails" after some accesses, or that returns one word
    /// with a bit flipped (a stale page): the first aborts, the second
    /// changes the checksum.
    struct Faulty {
        v: Vec<u64>,
        n: usize,
        gets: usize,
        fail_after: usize,
        flip_get: Option<usize>,
    }

    impl Faulty {
        fn new(fail_after: usize, flip_get: Option<usize>) -> Faulty {
            Faulty {
                v: alloc::vec![0; 8192],
                n: 0,
                gets: 0,
                fail_after,
                flip_get,
            }
        }
    }

    impl Words for Faulty {
        fn len(&self) -> usize {
            self.v.len()
        }
        fn get(&mut self, i: usize) -> u64 {
            self.n += 1;
            self.gets += 1;
            if self.flip_get == Some(self.gets) {
                return self.v[i] ^ 1;
            }
            self.v[i]
        }
        fn set(&mut self, i: usize, x: u64) {
            self.n += 1;
            self.v[i] = x;
        }
        fn failed(&self) -> bool {
            self.n > self.fail_after
        }
    }

    #[test]
    fn failed_memory_aborts_and_a_stale_word_shows() {
        for k in Kind::ALL {
            let mut f = Faulty::new(10_000, None);
            assert_eq!(run(k, &mut f, 1, 0), Err(Aborted), "{k:?}");
            let mut f = Faulty::new(usize::MAX, None);
            let good = run(k, &mut f, 1, 0).unwrap();
            assert_eq!(good, local(k, 8192, 1));
            // The last word read comes back stale.
            let mut bad = Faulty::new(usize::MAX, Some(f.gets));
            let bad = run(k, &mut bad, 1, 0).unwrap();
            assert!(bad.checksum != good.checksum || !bad.ok, "{k:?}");
        }
    }

    #[test]
    fn zipf_is_skewed() {
        let z = Zipf::new(1000);
        let mut rng = Rng::new(5);
        let mut hits = [0u32; 1000];
        for _ in 0..100_000 {
            hits[z.sample(&mut rng)] += 1;
        }
        // Rank 0 weighs 1/H(1000) ~ 13%; rank 9 a tenth of it.
        assert!((11_000..15_500).contains(&hits[0]), "{}", hits[0]);
        assert!(hits[0] > 5 * hits[9] && hits[9] > 0);
        assert!(hits[999] < 100);
    }
}
