"""What an item is: the fetch/prep protocol (:mod:`.source`), datasets (:mod:`.datasets`), transforms
(:mod:`.transforms`) and synthetic data (:mod:`.synth`)."""
