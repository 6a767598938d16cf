from apportion.target import device_layout, spyre


def test_2d_fp16_layout_puts_sticks_outermost():
    assert device_layout((1024, 4096), "float16", spyre()).shape == (64, 1024, 64)


def test_3d_fp16_layout_order():
    assert device_layout((128, 256, 512), "float16", spyre()).shape == (256, 8, 128, 64)


def test_1d_layout_is_sticks_then_elements_with_padding():
    lay = device_layout((100,), "float16", spyre())
    assert lay.shape == (2, 64) and lay.nbytes == 256


def test_span_is_extent_times_stride_of_outermost_varying_dim():
    lay = device_layout((8192, 32768), "float16", spyre())
    assert lay.span_bytes((8192, 32768)) == 512 << 20
    assert lay.span_bytes((8192, 16384)) == 256 << 20
    # a core owning one stick column varies along d0 only: rows x one stick
    assert lay.span_bytes((8192, 64)) == 8192 * 128
