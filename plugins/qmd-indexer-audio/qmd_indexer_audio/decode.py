"""Any supported recording, given as its bytes, to 16 kHz mono float32 samples in [-1, 1], in-process where possible.

Order of decoders: soundfile (libsndfile: wav, flac, ogg/vorbis, opus, mp3), then PyAV when installed (m4a, aac and
anything FFmpeg's libraries read), then the ``ffmpeg`` command when on ``PATH``. When all fail, ``AudioDecodeError``
says what each one answered and which tool is missing.
"""

from __future__ import annotations

import importlib.util
import io
import math
import shutil
import subprocess
import tempfile

import numpy as np

SAMPLE_RATE = 16_000  # what Whisper expects


class AudioDecodeError(ValueError):
    """The file could not be decoded (or is over the duration limit); the message says why."""


def to_16k_mono(samples: np.ndarray, rate: int) -> np.ndarray:
    """``samples`` (frames, or frames x channels) at ``rate`` Hz as 16 kHz mono float32; soxr when installed,
    else scipy's polyphase filter."""
    samples = np.asarray(samples, dtype=np.float32)
    mono = samples.mean(axis=1) if samples.ndim == 2 else samples
    if rate == SAMPLE_RATE or mono.size == 0:
        return np.ascontiguousarray(mono, dtype=np.float32)
    if importlib.util.find_spec("soxr") is not None:
        import soxr

        return np.asarray(soxr.resample(mono, rate, SAMPLE_RATE), dtype=np.float32)
    from scipy.signal import resample_poly

    g = math.gcd(int(rate), SAMPLE_RATE)
    return np.asarray(resample_poly(mono, SAMPLE_RATE // g, int(rate) // g), dtype=np.float32)


def _too_long(seconds: float, max_duration_s: float) -> None:
    if seconds > max_duration_s:
        raise AudioDecodeError(f"{seconds:.0f} s of audio is over the limit of {max_duration_s:.0f} s")


def _soundfile(data: bytes, max_duration_s: float) -> np.ndarray:
    import soundfile

    info = soundfile.info(io.BytesIO(data))
    if info.samplerate > 0:
        _too_long(info.frames / info.samplerate, max_duration_s)
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return to_16k_mono(samples, rate)


def _pyav(data: bytes, max_duration_s: float) -> np.ndarray:
    import av

    pieces: list[np.ndarray] = []
    total = 0
    with av.open(io.BytesIO(data)) as container:
        if not container.streams.audio:
            raise AudioDecodeError("no audio stream")
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        for frame in container.decode(container.streams.audio[0]):
            for out in resampler.resample(frame):
                pieces.append(out.to_ndarray().reshape(-1))
                total += pieces[-1].size
            _too_long(total / SAMPLE_RATE, max_duration_s)
        for out in resampler.resample(None):
            pieces.append(out.to_ndarray().reshape(-1))
    return np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)


def _ffmpeg(exe: str, data: bytes, max_duration_s: float) -> np.ndarray:
    # a private temporary copy, not a pipe: MP4/M4A files with their index at the end need a seekable input
    with tempfile.NamedTemporaryFile(prefix="qmd-indexer-audio-") as copy:
        copy.write(data)
        copy.flush()
        command = [exe, "-nostdin", "-v", "error", "-t", str(max_duration_s + 1), "-i", copy.name,
                   "-f", "f32le", "-ac", "1", "-ar", str(SAMPLE_RATE), "-"]
        run = subprocess.run(command, capture_output=True, check=False)
    if run.returncode != 0:
        lines = run.stderr.decode("utf-8", "replace").strip().splitlines()
        raise AudioDecodeError(lines[-1] if lines else f"exit status {run.returncode}")
    samples = np.frombuffer(run.stdout, dtype=np.float32).copy()
    _too_long(samples.size / SAMPLE_RATE, max_duration_s)
    return samples


def decode(data: bytes, max_duration_s: float = 3600.0) -> np.ndarray:
    """The recording ``data`` (a file's bytes, e.g. ``FileInfo.read_bytes()``) as 16 kHz mono float32 samples.
    Raises ``AudioDecodeError`` naming each decoder's failure and, when no fallback exists, the missing tool
    (``ffmpeg``)."""
    failures: list[str] = []
    try:
        return _soundfile(data, max_duration_s)
    except AudioDecodeError:
        raise
    except Exception as exc:  # libsndfile reports unknown or broken formats as LibsndfileError/RuntimeError
        failures.append(f"soundfile: {exc}")
    if importlib.util.find_spec("av") is not None:
        try:
            return _pyav(data, max_duration_s)
        except AudioDecodeError as exc:
            if "over the limit" in str(exc):
                raise
            failures.append(f"PyAV: {exc}")
        except Exception as exc:
            failures.append(f"PyAV: {type(exc).__name__}: {exc}")
    exe = shutil.which("ffmpeg")
    if exe is None:
        failures.append("ffmpeg: not installed (apt-get install ffmpeg, or pip install av)")
    else:
        try:
            return _ffmpeg(exe, data, max_duration_s)
        except AudioDecodeError as exc:
            if "over the limit" in str(exc):
                raise
            failures.append(f"ffmpeg: {exc}")
    raise AudioDecodeError("; ".join(failures))
