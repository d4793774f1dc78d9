//! Images on the native lane: the Qwen3-VL / Qwen3.5 vision tower, its image preprocessing and
//! the multimodal rotary positions of the text around the images.
//!
//! Numerics follow mlx-vlm 0.7.10 (`mlx_vlm/models/qwen3_vl/vision.py`,
//! `processing_qwen3_vl.py`, `qwen3_5/language.py::get_rope_index`).

pub mod preprocess;
pub mod prompt;
pub mod source;
pub mod tower;

pub use prompt::{expand_image_tokens, EncodedImage, ImageSpan, MultimodalPrompt};
pub use source::{read_image, ImageInput};
pub use tower::VisionTower;
