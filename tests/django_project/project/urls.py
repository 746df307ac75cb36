from django.urls import path
from shop import views

urlpatterns = [
    path("orders/", views.place_order),
    path("orders/<int:order_id>/pay/", views.pay_order),
    path("on-commit/orders/", views.place_order_on_commit),
    path("on-commit/orders/<int:order_id>/pay/", views.pay_order_on_commit),
]
