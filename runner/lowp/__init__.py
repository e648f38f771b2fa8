"""Low precision: what a precision is (``precisions``) and how its candidates are made and run.

- float16/bfloat16 by casting: ``convert`` (ONNX Runtime's float16 converter, ``conversion_repairs``),
  ``emulate`` (fp32 hardware rounding as fp16 would), ``fp16_switchboard``;
- int8 QDQ: ``calibration`` (with ``entropy`` and ``calibration_cache``), ``quant_options``, ``placement``
  (TensorRT's), ``quantize`` (ONNX Runtime's), ``qdq_switchboard``;
- int8 with the rest in fp16: ``mixed_qdq``;
- ``switchboard``: one model that runs every candidate of a search as its feeds.
"""
