use super::*;

/// A GGUF v3 header as llama.cpp's writer lays it out.
struct Writer(Vec<u8>);

impl Writer {
    fn new(n_tensors: u64, n_kv: u64) -> Writer {
        let mut w = Writer(b"GGUF".to_vec());
        w.0.extend(3u32.to_le_bytes());
        w.0.extend(n_tensors.to_le_bytes());
        w.0.extend(n_kv.to_le_bytes());
        w
    }
    fn string(&mut self, s: &str) {
        self.0.extend((s.len() as u64).to_le_bytes());
        self.0.extend(s.as_bytes());
    }
    fn kv_u32(&mut self, key: &str, v: u32) {
        self.string(key);
        self.0.extend(4u32.to_le_bytes());
        self.0.extend(v.to_le_bytes());
    }
    fn kv_str(&mut self, key: &str, v: &str) {
        self.string(key);
        self.0.extend(8u32.to_le_bytes());
        self.string(v);
    }
    fn kv_f32(&mut self, key: &str, v: f32) {
        self.string(key);
        self.0.extend(6u32.to_le_bytes());
        self.0.extend(v.to_le_bytes());
    }
    fn kv_i32s(&mut self, key: &str, v: &[i32]) {
        self.string(key);
        self.0.extend(9u32.to_le_bytes());
        self.0.extend(5u32.to_le_bytes());
        self.0.extend((v.len() as u64).to_le_bytes());
        v.iter().for_each(|x| self.0.extend(x.to_le_bytes()));
    }
    fn kv_strs(&mut self, key: &str, v: &[&str]) {
        self.string(key);
        self.0.extend(9u32.to_le_bytes());
        self.0.extend(8u32.to_le_bytes());
        self.0.extend((v.len() as u64).to_le_bytes());
        v.iter().for_each(|s| self.string(s));
    }
    fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32) {
        self.tensor_at(name, dims, type_id, 0);
    }
    fn tensor_at(&mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) {
        self.string(name);
        self.0.extend((dims.len() as u32).to_le_bytes());
        dims.iter().for_each(|d| self.0.extend(d.to_le_bytes()));
        self.0.extend(type_id.to_le_bytes());
        self.0.extend(offset.to_le_bytes());
    }
}

/// A 2-layer qwen2moe-shaped header: layer 0 dense (no experts), layer 1 MoE with a shared
/// expert; per-layer KV heads as an array.
fn qwen2moe_like() -> Vec<u8> {
    let mut w = Writer::new(4, 9);
    w.kv_str("general.architecture", "qwen2moe");
    w.kv_u32("qwen2moe.block_count", 2);
    w.kv_u32("qwen2moe.embedding_length", 2048);
    w.kv_u32("qwen2moe.attention.head_count", 16);
    w.kv_i32s("qwen2moe.attention.head_count_kv", &[0, 16]);
    w.kv_u32("qwen2moe.attention.key_length", 128);
    w.kv_u32("qwen2moe.expert_used_count", 4);
    w.kv_f32("qwen2moe.rope.freq_base", 1e6);
    w.kv_strs("tokenizer.ggml.tokens", &["a", "b"]);
    w.tensor("blk.0.ffn_up.weight", &[2048, 5632], 1);
    w.tensor("blk.1.ffn_up_exps.weight", &[2048, 1408, 60], 2);
    w.tensor("blk.1.ffn_down_exps.weight", &[1408, 2048, 60], 14);
    w.tensor("blk.1.ffn_up_shexp.weight", &[2048, 5632], 8);
    w.0.extend([0xAA; 64]); // tensor data: never read
    w.0
}

#[test]
fn reads_keys_and_tensor_table() {
    let h = read_header(&qwen2moe_like()[..]).unwrap();
    assert_eq!(h.arch(), Some("qwen2moe"));
    assert_eq!(h.arch_int("attention.head_count_kv"), Some(16));
    assert_eq!(h.kv["qwen2moe.rope.freq_base"], Value::Float(1e6));
    assert_eq!(h.kv["tokenizer.ggml.tokens"], Value::Other(2));
    assert_eq!(h.tensors.len(), 4);
    assert_eq!(h.tensor("blk.1.ffn_down_exps.weight").unwrap().type_id, 14);
}

#[test]
fn model_shape_from_header() {
    let h = read_header(&qwen2moe_like()[..]).unwrap();
    let s = model_shape(&h, "t").unwrap();
    assert_eq!(
        (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim),
        (2, 2048, 16, 16, 128)
    );
    assert_eq!(
        (s.n_expert, s.n_used, s.expert_ff, s.shared_ff),
        (60, 4, 1408, 5632)
    );
    assert_eq!(expert_type(&h), Some(2));
}

#[test]
fn gemma4s_fused_gate_up_and_dense_mlp_beside_the_experts() {
    let mut w = Writer::new(3, 5);
    w.kv_str("general.architecture", "gemma4");
    w.kv_u32("gemma4.block_count", 30);
    w.kv_u32("gemma4.embedding_length", 2816);
    w.kv_u32("gemma4.attention.head_count", 16);
    w.kv_u32("gemma4.expert_used_count", 8);
    w.tensor("blk.0.ffn_up.weight", &[2816, 2112], 2);
    w.tensor("blk.0.ffn_gate_up_exps.weight", &[2816, 1408, 128], 12);
    w.tensor("blk.0.ffn_down_exps.weight", &[704, 2816, 128], 14);
    w.0.extend([0xAA; 64]);
    let h = read_header(&w.0[..]).unwrap();
    let s = model_shape(&h, "t").unwrap();
    assert_eq!(
        (s.n_expert, s.n_used, s.expert_ff, s.shared_ff),
        (128, 8, 704, 2112)
    );
    assert_eq!(expert_type(&h), Some(12));
}

#[test]
fn every_truncation_is_an_error() {
    let full = qwen2moe_like();
    let header_len = full.len() - 64;
    for len in 0..header_len {
        assert!(read_header(&full[..len]).is_err(), "truncated at {len}");
    }
}

#[test]
fn refuses_wrong_magic_version_and_huge_lengths() {
    let mut f = qwen2moe_like();
    f[0] = b'X';
    assert!(read_header(&f[..]).is_err());
    let mut f = qwen2moe_like();
    f[4] = 9;
    assert!(read_header(&f[..]).is_err());
    // the first key's length: 2^40 bytes claimed
    let mut f = qwen2moe_like();
    f[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = read_header(&f[..]).unwrap_err();
    assert!(
        e.to_string().contains("too large") || e.to_string().contains("bytes"),
        "{e}"
    );
}

#[test]
fn a_header_without_experts_is_no_moe_model() {
    let mut w = Writer::new(1, 4);
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.block_count", 1);
    w.kv_u32("llama.embedding_length", 64);
    w.kv_u32("llama.attention.head_count", 4);
    w.tensor("blk.0.ffn_up.weight", &[64, 128], 1);
    let h = read_header(&w.0[..]).unwrap();
    assert!(model_shape(&h, "t").unwrap_err().contains("not a MoE"));
}

#[test]
fn tensor_bytes_from_offsets_and_file_length() {
    // listed out of data order, as a writer may
    let mut w = Writer::new(3, 1);
    w.kv_str("general.architecture", "t");
    w.tensor_at("b", &[4], 1, 96);
    w.tensor_at("a", &[4], 1, 0);
    w.tensor_at("c", &[4], 1, 160);
    let header_len = w.0.len() as u64;
    let h = read_header(&w.0[..]).unwrap();
    assert_eq!(h.data_start, header_len.div_ceil(32) * 32);
    assert_eq!(h.tensor_bytes(h.data_start + 200).unwrap(), [64, 96, 40]);
    assert!(h.tensor_bytes(h.data_start + 100).is_err());
    assert!(h.tensor_bytes(h.data_start - 1).is_err());
}
