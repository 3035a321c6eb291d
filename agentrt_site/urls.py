from django.conf import settings
from django.contrib import admin
from django.http import HttpResponseRedirect, JsonResponse
from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods


@csrf_exempt
@require_http_methods(["POST"])
def demo_hook(request):
    """A stand-in deploy hook for the demo agents' http_post (not authenticated, records nothing)."""
    return JsonResponse({"received": True, "idempotency_key": request.headers.get("Idempotency-Key")})


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", include("runs.api.urls")),
    path("", include("ops.urls")),
    path("", include("runs.web.urls")),
    path("", lambda request: HttpResponseRedirect("/runs/")),
]
if settings.AGENTRT_DEMO:  # only `make run` (manage.py demo) mounts the unauthenticated stand-in hook
    urlpatterns.insert(3, path("demo/hook", demo_hook))
