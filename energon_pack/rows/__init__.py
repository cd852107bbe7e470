"""Row assembly: sample types between stages (``encoded``), THD rows (``thd``), loss weights
(``loss_reduction``), modelled FLOPs of a row (``flops``) and the trainer side of a row (``step``: device batches, CP split).
"""
