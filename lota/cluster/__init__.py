"""The cluster: every node's cache as one, each chunk owned by one node.

- :mod:`lota.cluster.ownership`: which member owns a chunk (a Maglev table over the
  members: O(1) per lookup, balanced to within a slot, stable when members come and go),
  and the order of the next owners to try when it is down.
"""
