"""What an item is and where datasets of them come from: the fetch/prep protocol every source implements
(:mod:`.source`), datasets of image files (:mod:`.files`: ``coordl.ImageFolder``, ``coordl.FileListDataset``),
the adapter for datasets that do not split fetch from prep (:mod:`.adapt`) and synthetic image folders
(:mod:`.synth`)."""
