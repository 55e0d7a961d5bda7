"""Remote prep on Ray: a ``coordl.DataLoader`` hands part of its prep to CPU workers on other machines.

    prep = coordl.RemotePrep("10.0.0.1:6379", cpus=8)
    loader = coordl.DataLoader(train, batch_size=64, num_workers=4, generator=g, remote_prep=prep)

The loader's order (its sampler, resumable state and per-item seeds) stays in the trainer. Batches of
item indices go to Ray actors, one per remote CPU, each running the dataset's own ``prep`` with the
seed the item would have had in a local worker; the collated batch comes back through Ray's object
store. Local workers keep working: a batch goes to whichever side asks for work first (torch's workers
when they hand a batch out, an actor when it returns one), and the trainer gets the batches in the
sampler's order. See docs/remote_prep.md.

* :mod:`coordl.remote.connect`: the user's :class:`RemotePrep` (address, CPUs, token) and the connection;
* :mod:`coordl.remote.actor`: what runs on a remote CPU, and the prep of a batch shared with the trainer;
* :mod:`coordl.remote.dispatch`: the loader's side: actors, the merged epoch, faults and ``stats()``.

Ray is optional (``pip install 'coordl[ray]'``): it is imported only when a loader connects.
"""

from __future__ import annotations

from coordl.remote.connect import RemotePrep, RemotePrepError

__all__ = ["RemotePrep", "RemotePrepError"]
