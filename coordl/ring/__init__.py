"""The zero-copy batch ring between loader workers and the main process: the main process's side
(:mod:`.reader`), the workers' side (:mod:`.writer`, stacking samples as made in :mod:`.stacker`), the
structure of a batch (:mod:`.layout`) and transforms writing into their batch row (:mod:`.output_buffers`)."""
