# Type stub of the compiled fastpath._int8 (Cython); semantics in fastpath.reference.int8.
import numpy as np
import numpy.typing as npt

def int8_dot(
    codes: npt.ArrayLike,
    scales: npt.ArrayLike,
    query: npt.ArrayLike,
) -> npt.NDArray[np.float32]: ...
