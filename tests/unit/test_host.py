from autotune.tuner.host import catalog_gpu_name


def test_nvml_names_map_to_the_catalog():
    assert catalog_gpu_name("NVIDIA H200") == "H200"
    assert catalog_gpu_name("NVIDIA H100 80GB HBM3") == "H100-SXM"
    assert catalog_gpu_name("NVIDIA A800-SXM4-80GB") == "A800"
    assert catalog_gpu_name("NVIDIA A100-SXM4-80GB") == "A100-80G"
    assert catalog_gpu_name("NVIDIA A100-SXM4-40GB") is None
    assert catalog_gpu_name("Tesla T4") is None
