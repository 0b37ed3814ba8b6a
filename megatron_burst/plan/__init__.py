"""The plan data: where tokens sit and which blocks each ring member computes, as data.

Pure Python and numpy, no tensors and no communication, so everything above can plan (and
tests can enumerate) without a GPU. One module per job:

- ``layouts``: the names of the ways tokens are placed on the ranks;
- ``segments``: a shard's rows as segments of documents (``Shard``, ``Segment``);
- ``placement``: which positions of which document each rank holds, per layout
  (``whole_docs``: the whole-documents layout, planned with array operations);
- ``blocks``: what a kernel computes (``Block``, ``Mask``);
- ``schedule``: which blocks each member computes at each ring step, and which K/V rows
  travel (``RingSchedule``): masks and layouts as data, so the ring stays one loop;
  ``runs``: those rows as runs, so a window's hop carries the edges it is read at;
- ``packs``: a pack of documents described once per micro-batch (``DocumentPack``);
- ``slices``: general slice masks (``SliceMask``) as disjoint bands; ``mask_placement``:
  a mask's tokens placed by visible area; ``mask_families``: LongCA-bench's masks.
"""
