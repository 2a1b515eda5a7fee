//! A GGUF header reader: the metadata and the tensor table, never the weights, so a 20 GB
//! model is described in milliseconds. GGUF's header is a flat list of typed key/value pairs
//! and tensor records (ggml's docs/gguf.md, versions 2 and 3); this reads it in one pass
//! without seeking. Array values are skipped except integer arrays (per-layer counts).
//!
//! A reader of its own rather than a crate: the probe needs some forty lines of the format (no
//! tensor data, no writing), every length it reads is bounded before it allocates, and the
//! library's dependency rules do not reach the probe but a small reader keeps its build light.

use crate::timeline::ModelShape;
use std::collections::BTreeMap;
use std::io::{self, Read};

/// One metadata value; strings and integer arrays kept, other arrays counted.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(i128),
    Float(f64),
    Bool(bool),
    Str(String),
    Ints(Vec<i128>),
    /// An array of strings, floats or arrays: only its length.
    Other(u64),
}

/// One tensor record: ggml's `ne` (innermost first) and type id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    /// Byte offset of its data from [`Header::data_start`].
    pub offset: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Header {
    pub kv: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    /// File offset of the tensor data: the header's end aligned to `general.alignment`.
    pub data_start: u64,
}

// A header larger than these is not a model this probe can be asked about: refuse it rather
// than allocate what a corrupt length says.
const MAX_STRING: u64 = 1 << 20;
const MAX_COUNT: u64 = 1 << 24;

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

struct Reader<R> {
    r: R,
    /// Bytes read so far.
    pos: u64,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut b = [0; N];
        self.r.read_exact(&mut b)?;
        self.pos += N as u64;
        Ok(b)
    }
    fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn count(&mut self, what: &str) -> io::Result<u64> {
        let n = self.u64()?;
        if n > MAX_COUNT {
            return Err(bad(format!("{what}: count {n} too large")));
        }
        Ok(n)
    }
    fn string(&mut self) -> io::Result<String> {
        let n = self.u64()?;
        if n > MAX_STRING {
            return Err(bad(format!("string of {n} bytes")));
        }
        let mut b = vec![0; n as usize];
        self.r.read_exact(&mut b)?;
        self.pos += n;
        String::from_utf8(b).map_err(|e| bad(format!("string: {e}")))
    }

    /// A scalar of GGUF value type `t` (0..=12 but 8 string and 9 array).
    fn scalar(&mut self, t: u32) -> io::Result<Value> {
        Ok(match t {
            0 => Value::Int(self.bytes::<1>()?[0] as i128),
            1 => Value::Int(i8::from_le_bytes(self.bytes()?) as i128),
            2 => Value::Int(u16::from_le_bytes(self.bytes()?) as i128),
            3 => Value::Int(i16::from_le_bytes(self.bytes()?) as i128),
            4 => Value::Int(self.u32()? as i128),
            5 => Value::Int(i32::from_le_bytes(self.bytes()?) as i128),
            6 => Value::Float(f32::from_le_bytes(self.bytes()?) as f64),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            10 => Value::Int(self.u64()? as i128),
            11 => Value::Int(i64::from_le_bytes(self.bytes()?) as i128),
            12 => Value::Float(f64::from_le_bytes(self.bytes()?)),
            _ => return Err(bad(format!("value type {t}"))),
        })
    }

    fn value(&mut self, t: u32) -> io::Result<Value> {
        if t != 9 {
            return self.scalar(t);
        }
        let (item, n) = (self.u32()?, self.count("array")?);
        if item == 9 {
            // llama.cpp writes none; refusing them bounds the recursion
            return Err(bad("nested arrays".into()));
        }
        let mut ints = Vec::new();
        for _ in 0..n {
            if let Value::Int(v) = self.scalar(item)? {
                ints.push(v);
            }
        }
        Ok(if matches!(item, 0..=5 | 10 | 11) {
            Value::Ints(ints)
        } else {
            Value::Other(n)
        })
    }
}

/// Reads the header of the GGUF stream `r` (its first bytes): the key/value pairs and the
/// tensor table, stopping before the tensor data.
pub fn read_header(r: impl Read) -> io::Result<Header> {
    let mut r = Reader { r, pos: 0 };
    if &r.bytes::<4>()? != b"GGUF" {
        return Err(bad("not a GGUF file (magic)".into()));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(bad(format!("GGUF version {version} (2 and 3 are read)")));
    }
    let (n_tensors, n_kv) = (r.count("tensors")?, r.count("key/values")?);
    let mut header = Header::default();
    for _ in 0..n_kv {
        let key = r.string()?;
        let t = r.u32()?;
        let v = r.value(t).map_err(|e| bad(format!("{key}: {e}")))?;
        header.kv.insert(key, v);
    }
    for _ in 0..n_tensors {
        let name = r.string()?;
        let n_dims = r.u32()?;
        if n_dims > 4 {
            return Err(bad(format!("{name}: {n_dims} dimensions")));
        }
        let dims = (0..n_dims).map(|_| r.u64()).collect::<io::Result<_>>()?;
        let type_id = r.u32()?;
        let offset = r.u64()?;
        header.tensors.push(TensorInfo {
            name,
            dims,
            type_id,
            offset,
        });
    }
    let align = header.int("general.alignment").unwrap_or(32).max(1);
    header.data_start = r.pos.div_ceil(align) * align;
    Ok(header)
}

impl Header {
    /// The architecture (`general.architecture`), the prefix of its hyperparameters' keys.
    pub fn arch(&self) -> Option<&str> {
        self.str("general.architecture")
    }

    /// `{arch}.{key}` as an integer.
    pub fn arch_int(&self, key: &str) -> Option<u64> {
        self.int(&format!("{}.{key}", self.arch()?))
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        match self.kv.get(key)? {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// An integer key; of a per-layer array, its largest value.
    pub fn int(&self, key: &str) -> Option<u64> {
        match self.kv.get(key)? {
            Value::Int(v) => u64::try_from(*v).ok(),
            Value::Ints(v) => v.iter().max().and_then(|&m| u64::try_from(m).ok()),
            _ => None,
        }
    }

    /// Each tensor's bytes, in table order, from the offsets (the next tensor's, or the end of
    /// a file of `file_len` bytes): every type's size without a table of block sizes; the
    /// alignment padding after a tensor (under 32 bytes) counts as its own.
    pub fn tensor_bytes(&self, file_len: u64) -> Result<Vec<u64>, String> {
        let mut starts: Vec<u64> = self.tensors.iter().map(|t| t.offset).collect();
        starts.sort_unstable();
        let data_len = file_len
            .checked_sub(self.data_start)
            .ok_or("file shorter than its header")?;
        self.tensors
            .iter()
            .map(|t| {
                let next = starts.partition_point(|&s| s <= t.offset);
                let end = starts.get(next).copied().unwrap_or(data_len);
                end.checked_sub(t.offset)
                    .ok_or_else(|| format!("{}: data beyond the file's end", t.name))
            })
            .collect()
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// The board model's shape of the MoE model in `h`: layers, widths, heads and expert counts
/// from the hyperparameters, the expert and shared-expert widths from the tensor table (the
/// keys naming them differ between architectures; the tensors do not). `name` labels it.
pub fn model_shape(h: &Header, name: &'static str) -> Result<ModelShape, String> {
    let arch = h.arch().ok_or("no general.architecture")?;
    let need = |key: &str| {
        h.arch_int(key)
            .map(|v| v as usize)
            .ok_or_else(|| format!("{arch}: no {arch}.{key}"))
    };
    let (layers, hidden, heads) = (
        need("block_count")?,
        need("embedding_length")?,
        need("attention.head_count")?,
    );
    let (layer, expert) =
        routed_up(h).ok_or_else(|| format!("{arch}: no ffn_up_exps tensor (not a MoE model?)"))?;
    let [k, up_width, n_expert] = expert.dims[..] else {
        return Err(format!("{}: dims {:?}", expert.name, expert.dims));
    };
    // gemma4 fuses gate and up: one tensor twice the expert width.
    let ff = if expert.name.ends_with("ffn_gate_up_exps.weight") {
        up_width / 2
    } else {
        up_width
    };
    if k as usize != hidden {
        return Err(format!(
            "{}: K {k} is not the hidden size {hidden}",
            expert.name
        ));
    }
    // A shared expert, or (gemma4) a dense MLP beside the experts of the same layer.
    let shared_ff = ["ffn_up_shexp.weight", "ffn_up.weight"]
        .iter()
        .find_map(|suffix| h.tensor(&format!("blk.{layer}.{suffix}")))
        .map_or(0, |t| t.dims[1] as usize);
    // Latent attention (deepseek2) keeps one latent "KV head" of key_length; its per-head
    // query/key width is key_length_mla, priced as that many full heads.
    let mla = h.arch_int("attention.key_length_mla").map(|v| v as usize);
    let kv_heads = h.arch_int("attention.head_count_kv").map(|v| v as usize);
    let head_dim = h.arch_int("attention.key_length").map(|v| v as usize);
    Ok(ModelShape {
        name,
        layers,
        hidden,
        heads,
        kv_heads: if mla.is_some() {
            heads
        } else {
            kv_heads.unwrap_or(heads)
        },
        head_dim: mla.or(head_dim).unwrap_or(hidden / heads),
        n_expert: n_expert as usize,
        n_used: need("expert_used_count")?,
        expert_ff: ff as usize,
        shared_ff,
    })
}

/// The routed experts' weight type: that of the first expert layer's up (or fused gate+up)
/// tensor (llama-quantize's mixes may give down another type; the board model prices one).
pub fn expert_type(h: &Header) -> Option<u32> {
    routed_up(h).map(|(_, t)| t.type_id)
}

/// The lowest layer with routed experts and its `ffn_up_exps` (or gemma4's fused
/// `ffn_gate_up_exps`) tensor; leading dense layers have none.
fn routed_up(h: &Header) -> Option<(usize, &TensorInfo)> {
    h.tensors
        .iter()
        .filter_map(|t| {
            let (layer, tail) = t.name.strip_prefix("blk.")?.split_once('.')?;
            matches!(tail, "ffn_up_exps.weight" | "ffn_gate_up_exps.weight").then_some(())?;
            Some((layer.parse::<usize>().ok()?, t))
        })
        .min_by_key(|&(layer, _)| layer)
}

#[cfg(test)]
mod tests;
