"""The object stores a workspace can live on, and the one thing fsspec does not give:
conditional writes, which the workspace lock rests on (xylent/remote.py).

Each store names a version of an object with a *tag* (S3 and Azure: the ETag; GCS:
the generation) and offers create-if-absent, replace-if-unchanged, read-with-tag and
delete-if-unchanged.  A lost condition raises :class:`Conflict`; a missing object
:class:`FileNotFoundError` (S3 and Azure say so on a conditional write too; GCS answers
412 there, a Conflict, so the lock reads the object again before it decides).
Everything else (listing, upload, download, streaming shards) is plain fsspec, so
credentials come from each store's usual environment.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from xylent.errors import XylentError


class Conflict(Exception):
    """A conditional write or delete lost: the object exists, or is not the version named."""


class Store(ABC):
    scheme = ""
    package = ""  # the fsspec implementation it needs
    extra = ""  # the pyproject extra that installs it
    credentials = ""

    def __init__(self, bucket: str):
        self.bucket = bucket
        self.fs = self._filesystem()

    @abstractmethod
    def _filesystem(self) -> Any:
        """The store's fsspec filesystem (ImportError when its package is missing)."""

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    @abstractmethod
    def create(self, key: str, data: bytes) -> str:
        """Write ``key`` only if it does not exist; its new tag."""

    @abstractmethod
    def replace(self, key: str, data: bytes, tag: str) -> str:
        """Overwrite ``key`` only if it is still at ``tag``; its new tag."""

    @abstractmethod
    def read(self, key: str) -> tuple[bytes, str]:
        """The bytes and tag of one version of ``key``."""

    @abstractmethod
    def delete(self, key: str, tag: str) -> None:
        """Delete ``key`` only if it is still at ``tag``."""


class S3(Store):
    scheme, package, extra = "s3", "s3fs", "s3"
    credentials = ("the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a profile) and endpoint "
                   "(AWS_ENDPOINT_URL)")

    def _filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(use_listings_cache=False, skip_instance_cache=True)

    def _put(self, key: str, data: bytes, **condition) -> str:
        try:
            return self.fs.call_s3("put_object", Bucket=self.bucket, Key=key, Body=data, **condition)["ETag"]
        except Exception as exc:
            if _s3_precondition(exc):
                raise Conflict(key) from None
            raise

    def create(self, key, data):
        return self._put(key, data, IfNoneMatch="*")

    def replace(self, key, data, tag):
        return self._put(key, data, IfMatch=tag)

    def read(self, key):
        from fsspec.asyn import sync

        async def read() -> tuple[bytes, str]:  # s3fs' client is async
            got = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=key)
            async with got["Body"] as body:
                return await body.read(), got["ETag"]

        return sync(self.fs.loop, read)

    def delete(self, key, tag):
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=key, IfMatch=tag)
        except Exception as exc:
            if _s3_precondition(exc):
                raise Conflict(key) from None
            raise


def _s3_precondition(exc: BaseException) -> bool:
    """A lost condition: 412 PreconditionFailed, or 409 ConditionalRequestConflict, which S3
    answers when two conditional writes race.  s3fs maps only some of these (If-None-Match's
    412 to FileExistsError, others to a bare OSError), so read botocore's code beneath."""
    if isinstance(exc, FileExistsError):
        return True
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict", "412") or status == 412


class Azure(Store):
    """Azure Blob Storage: ``az://container/prefix`` (adlfs; also ``abfs://``)."""

    scheme, package, extra = "az", "adlfs", "azure"
    credentials = ("the credentials (AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
                   "AZURE_STORAGE_ACCOUNT_KEY / AZURE_STORAGE_SAS_TOKEN / a service principal)")

    def _filesystem(self):
        import adlfs

        return adlfs.AzureBlobFileSystem(skip_instance_cache=True)

    def _call(self, key: str, method: str, *args, **kwargs):
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError
        from fsspec.asyn import sync

        blob = self.fs.service_client.get_blob_client(self.bucket, key)
        try:
            return sync(self.fs.loop, getattr(blob, method), *args, **kwargs)
        except (ResourceExistsError, ResourceModifiedError):
            raise Conflict(key) from None
        except ResourceNotFoundError:
            raise FileNotFoundError(self.url(key)) from None

    @staticmethod
    def _if(tag: str) -> dict:
        from azure.core import MatchConditions

        return {"etag": tag, "match_condition": MatchConditions.IfNotModified}

    def create(self, key, data):
        return self._call(key, "upload_blob", data, overwrite=False)["etag"]

    def replace(self, key, data, tag):
        return self._call(key, "upload_blob", data, overwrite=True, **self._if(tag))["etag"]

    def read(self, key):
        from azure.core.exceptions import ResourceNotFoundError
        from fsspec.asyn import sync

        async def read() -> tuple[bytes, str]:
            stream = await self.fs.service_client.get_blob_client(self.bucket, key).download_blob()
            return await stream.readall(), stream.properties.etag

        try:
            return sync(self.fs.loop, read)
        except ResourceNotFoundError:
            raise FileNotFoundError(self.url(key)) from None

    def delete(self, key, tag):
        self._call(key, "delete_blob", **self._if(tag))


class GCS(Store):
    """Google Cloud Storage: ``gs://bucket/prefix`` (gcsfs); the tag is the object's generation."""

    scheme, package, extra = "gs", "gcsfs", "gcs"
    credentials = ("the credentials (GOOGLE_APPLICATION_CREDENTIALS or `gcloud auth application-default "
                   "login`)")

    def _filesystem(self):
        import os

        import gcsfs

        emulator = os.environ.get("STORAGE_EMULATOR_HOST")  # emulators (fake-gcs-server) take no credentials
        return gcsfs.GCSFileSystem(skip_instance_cache=True, token="anon" if emulator else None)

    def _upload(self, key: str, data: bytes, generation: str) -> str:
        # a multipart upload: GCS (and its emulators) check ifGenerationMatch on it; 0 means "absent"
        meta = json.dumps({"name": key})
        body = (f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n--==0==\n"
                "Content-Type: application/octet-stream\n\n").encode() + data + b"\n--==0==--"
        try:
            out = self.fs.call("POST", f"{self.fs._location}/upload/storage/v1/b/{{}}/o", self.bucket,
                               uploadType="multipart", ifGenerationMatch=generation, data=body, json_out=True,
                               headers={"Content-Type": 'multipart/related; boundary="==0=="'})
        except FileExistsError:  # gcsfs' name for 412
            raise Conflict(key) from None
        return str(out["generation"])

    def create(self, key, data):
        return self._upload(key, data, "0")

    def replace(self, key, data, tag):
        return self._upload(key, data, tag)

    def read(self, key):
        headers, data = self.fs.call("GET", "b/{}/o/{}", self.bucket, key, alt="media")
        return data, str(headers["x-goog-generation"])

    def delete(self, key, tag):
        # GCS checks ifGenerationMatch on the delete itself; reading the generation first also keeps
        # an emulator that ignores delete preconditions (fake-gcs-server) from removing a newer lock
        try:
            if self.read(key)[1] != tag:
                raise Conflict(key)
            self.fs.call("DELETE", "b/{}/o/{}", self.bucket, key, ifGenerationMatch=tag)
        except (FileNotFoundError, FileExistsError):
            raise Conflict(key) from None


STORES: dict[str, type[Store]] = {"s3": S3, "s3a": S3, "az": Azure, "abfs": Azure, "gs": GCS, "gcs": GCS}


def store_class(scheme: str, url: str) -> type[Store]:
    """The store behind a workspace URL's scheme, or a clear error naming the ones there are."""
    kind = STORES.get(scheme)
    if kind is None:
        raise XylentError(
            f"workspace {url!r}: {scheme}:// is not supported; object-storage workspaces are s3:// (AWS S3 or "
            "any S3-compatible store: MinIO, Ceph, R2), gs:// (Google Cloud Storage) or az:// (Azure Blob)",
            where="--workspace / spec field workspace",
            fix="use s3://, gs:// or az://bucket/prefix, or a local/network-mounted folder")
    return kind


def open_store(kind: type[Store], bucket: str) -> Store:
    try:
        return kind(bucket)
    except ImportError:
        raise XylentError(f"a {kind.scheme}:// workspace needs {kind.package}", where="--workspace",
                          fix=f"pip install 'xylent[{kind.extra}]' (or {kind.package})") from None
