"""Row assembly: sample types between stages (``encoded``), THD rows (``thd``), loss weights
(``loss_reduction``) and the trainer side of a row (``step``: device batches, CP split).
"""
