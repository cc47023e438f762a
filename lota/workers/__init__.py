"""Worker processes: every core of a node serves, over one cache.

One Python process serves with one core. With ``workers = N`` (default: the CPUs the
process may use), ``lota serve`` becomes a supervisor (:mod:`lota.workers.supervisor`)
of N worker processes, each a whole node (:func:`lota.node.build.build_node`) serving the
one listen address. How they share one cache: **a worker is a peer on loopback.**

- The node's cache is split by chunk, not by copy: each chunk (bucket, key, ETag, index)
  has an owner worker (:func:`lota.cluster.ownership.worker_of`, rendezvous hashing),
  which alone fills and keeps it, in ``DIR/worker-K`` of every cache directory, within
  its share (1/N) of the budget. So the node holds each chunk once, and there is one
  single flight per chunk: a miss is fetched from the origin by its owner only.
- A worker serving a chunk another worker owns asks that sibling over a Unix socket
  (:mod:`lota.workers.siblings`): if the sibling holds it, the sibling hands over the
  chunk file's descriptor (``socket.send_fds``), and the worker that has the client sends
  it with ``sendfile`` itself — hits stay zero-copy, and descriptors are kept a while so a
  hot chunk costs the sibling nothing more; if not, the sibling fills it (once, however
  many ask) and streams it, as an owner node streams to a peer.
- An object's metadata has a home worker too (by bucket and key,
  :class:`lota.workers.placement.MetadataHome`): a worker that does not know an object
  asks that sibling, which asks the origin once for the node, so the first reads of a
  hot set cost the origin one HEAD per object, not one per object per worker.
- In a cluster, a chunk's owner is a node first (:mod:`lota.cluster.ownership`), then a
  worker of that node; other nodes' requests reach any worker of the node, which asks the
  owning sibling.

Why not one process owning the cache, the others serving: every hit would be a round trip
to that one process, which would then be the node's one busy core again. Why not shared
memory: the index, eviction and fills would need locks across processes; here they stay
the single-threaded code they are, each over its own share.

A worker that dies loses only its own connections; the supervisor starts it again, and it
finds its share of the cache on disk. The supervisor holds the listening sockets
(``SO_REUSEPORT``, one per worker), so connections that arrive meanwhile wait in the dead
worker's queue rather than being refused. SIGTERM drains every worker.
"""
