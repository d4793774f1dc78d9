//! Where an image of a request comes from: a local path, a `file://` URL or a `data:` URL with
//! base64 bytes (what OpenAI clients send). Nothing is fetched from the network: an `http(s)`
//! URL is refused with a message saying so (the caller downloads it if the user allows it).

use std::path::Path;

use base64::Engine as _;
use mtp_contract::ImageRef;

use crate::error::{Error, Result};

pub use mtp_contract::ImageInput;

/// Reads images larger than this refused (the decoder's own pixel limit comes on top).
pub const MAX_IMAGE_BYTES: u64 = 64 << 20;

/// Reads the image `spec` names (the `index`-th of its request, counted from 0).
pub fn read_image(spec: &str, index: usize) -> Result<ImageInput> {
    let spec = spec.trim();
    let path = match ImageRef::of(spec) {
        ImageRef::Inline => return read_data_url(spec, index),
        ImageRef::Remote => {
            return Err(Error::Unsupported(format!(
                "fetching image {index} from {spec}: images are not downloaded by the engine; \
                 save it and pass its path, or send it as a data URL"
            )))
        }
        ImageRef::Other => {
            return Err(Error::ImageSource(format!(
                "image {index}: `{spec}` is neither a path nor a file:// or data: URL"
            )))
        }
        ImageRef::File(p) => p,
    };
    let path = Path::new(path);
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(Error::ImageSource(format!(
            "{} is not a file",
            path.display()
        )));
    }
    if meta.len() > MAX_IMAGE_BYTES {
        return Err(Error::ImageSource(format!(
            "{} is {} MiB, over the {} MiB an image may take",
            path.display(),
            meta.len() >> 20,
            MAX_IMAGE_BYTES >> 20
        )));
    }
    let bytes = std::fs::read(path).map_err(io)?;
    Ok(ImageInput {
        name: path.display().to_string(),
        bytes: bytes.into(),
    })
}

/// The bytes of a base64 `data:` URL.
fn read_data_url(spec: &str, index: usize) -> Result<ImageInput> {
    let rest = &spec["data:".len()..];
    let Some((meta, data)) = rest.split_once(',') else {
        return Err(Error::ImageSource(format!(
            "image {index}: a data URL without a comma before its data"
        )));
    };
    if !meta.ends_with(";base64") {
        return Err(Error::ImageSource(format!(
            "image {index}: only base64 data URLs are read (`data:image/png;base64,...`)"
        )));
    }
    let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if clean.len() as u64 > MAX_IMAGE_BYTES / 3 * 4 + 4 {
        return Err(Error::ImageSource(format!(
            "image {index}: the data URL is over {} MiB",
            MAX_IMAGE_BYTES >> 20
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(clean.as_bytes())
        .map_err(|e| {
            Error::ImageSource(format!("image {index}: bad base64 in its data URL: {e}"))
        })?;
    Ok(ImageInput {
        name: format!("image {index} (data URL)"),
        bytes: bytes.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.png");
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(&*read_image(p.to_str().unwrap(), 0).unwrap().bytes, b"abc");
        let url = format!("file://{}", p.display());
        assert_eq!(&*read_image(&url, 0).unwrap().bytes, b"abc");
        let data = read_image("data:image/png;base64,YWJj", 2).unwrap();
        assert_eq!(&*data.bytes, b"abc");
        assert_eq!(data.name, "image 2 (data URL)");
        for bad in [
            "data:image/png;base64,@@@",
            "data:image/png,abc",
            "data:image/png;base64",
            "ftp://host/x.png",
        ] {
            assert!(
                matches!(read_image(bad, 0), Err(Error::ImageSource(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            read_image("https://example.invalid/x.png", 0),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            read_image(d.path().join("missing.png").to_str().unwrap(), 0),
            Err(Error::Io { .. })
        ));
        assert!(matches!(
            read_image(d.path().to_str().unwrap(), 0),
            Err(Error::ImageSource(_))
        ));
    }
}
