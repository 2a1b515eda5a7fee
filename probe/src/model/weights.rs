//! Synthetic weights at real sizes: one layer's gate, up and down expert tensors (or its dense
//! weight matrices), generated once into a file under `~/.cache/ork-moe/model-weights/` and mapped once per
//! layer the probe runs. Each mapping has its own addresses (so the engine's cache sees
//! distinct experts per layer, as with a real model) while all share the page cache: the
//! probe's memory is one layer's weights whatever `--layers` says.

use memmap2::{Mmap, MmapOptions};
use ork_moe::quant::GgmlType;
use ork_moe::testutil::Rng;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// One weight tensor of a layer: `[K, N, n_expert]` blocks of `ty` (`n_expert` 1: a matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tensor {
    pub ty: GgmlType,
    pub k: usize,
    pub n: usize,
    pub n_expert: usize,
    /// Byte offset in the layer.
    pub offset: usize,
}

impl Tensor {
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.k).expect("K is whole blocks")
    }

    pub fn bytes(&self) -> usize {
        self.row_bytes() * self.n * self.n_expert
    }
}

/// Tensors of `(type, K, N)` with `n_expert` experts each, laid out back to back.
pub fn layout(shapes: &[(GgmlType, usize, usize)], n_expert: usize) -> Vec<Tensor> {
    let mut offset = 0;
    shapes
        .iter()
        .map(|&(ty, k, n)| {
            let t = Tensor {
                ty,
                k,
                n,
                n_expert,
                offset,
            };
            offset += t.bytes();
            t
        })
        .collect()
}

fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/ork-moe/model-weights")
}

/// The layer file for `name` holding `tensors`, generated if missing; then `layers` mappings
/// of it.
pub fn map_layers(name: &str, tensors: &[Tensor], layers: usize) -> Result<Vec<Mmap>, String> {
    let path = cache_dir().join(format!("{name}.bin"));
    let size: usize = tensors.iter().map(Tensor::bytes).sum();
    let have = std::fs::metadata(&path).map(|m| m.len()).ok();
    if have != Some(size as u64) {
        generate(&path, tensors, name).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let file = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    (0..layers)
        .map(|_| {
            // SAFETY: the file is the probe's own cache entry, written completely before this
            // (renamed into place) and never written while mapped; a private read-only mapping.
            unsafe { MmapOptions::new().map(&file) }
                .map_err(|e| format!("mmap {}: {e}", path.display()))
        })
        .collect()
}

fn generate(path: &Path, tensors: &[Tensor], name: &str) -> std::io::Result<()> {
    let size: usize = tensors.iter().map(Tensor::bytes).sum();
    eprintln!(
        "model: generating {:.0} MB of synthetic weights into {} (once)",
        size as f64 / 1e6,
        path.display()
    );
    std::fs::create_dir_all(path.parent().expect("a file in a folder"))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut out = BufWriter::new(File::create(&tmp)?);
    // Deterministic per file name: the same name always holds the same bytes.
    let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut rng = Rng::new(seed);
    for t in tensors {
        let blocks_per_expert = t.n * t.k / t.ty.block_elems();
        for _ in 0..t.n_expert {
            out.write_all(&rng.blocks(t.ty, blocks_per_expert, 0.02))?;
        }
    }
    out.into_inner()?.sync_all()?;
    std::fs::rename(&tmp, path)
}
