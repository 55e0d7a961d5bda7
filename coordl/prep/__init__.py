"""From an item's stored bytes to a training sample on the CPU: image decoding (:mod:`.decode`), decoding
only a random crop's box with the native crop decoder (:mod:`.cropdecode`, C sources in ``_jpeg/``), JPEGs
rewritten so that the crop decoder skips more (:mod:`.cropindex`, ``coordl crop-index``), the transforms
(:mod:`.transforms`, ``coordl.transforms``) and the standard recipes' parameters (:mod:`.recipe`)."""
